-- Calls to a model with no known price (not in litellm's cost map, none in the policy) are recorded at $0;
-- this flag keeps that $0 from passing for a free model. The partial index finds the few flagged calls of a
-- time range without touching the rest.
ALTER TABLE upstream_calls ADD COLUMN unpriced INTEGER NOT NULL DEFAULT 0;
CREATE INDEX upstream_calls_unpriced_created_at ON upstream_calls (created_at) WHERE unpriced = 1;
