-- Calls to a model with no known price (not in litellm's cost map, none in the policy) are recorded at $0;
-- this flag keeps that $0 from passing for a free model. The partial index holds only the flagged calls, so
-- listing unpriced models never reads the priced ones. (An integer, as in SQLite, so both engines take the
-- same rows.)
ALTER TABLE upstream_calls ADD COLUMN unpriced integer NOT NULL DEFAULT 0;
CREATE INDEX upstream_calls_unpriced ON upstream_calls (model, request_id) WHERE unpriced = 1;
