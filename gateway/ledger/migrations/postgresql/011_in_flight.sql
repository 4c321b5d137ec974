-- PostgreSQL twin of sqlite/011_in_flight.sql: requests in flight, each also the request's reservation against
-- its key's budget and TPM until the finished row replaces it (gateway/ledger/budget.py).
CREATE TABLE requests_in_flight (
    request_id text PRIMARY KEY,
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    owner text NOT NULL,
    key_id text,
    policy text,
    alias text,
    stream integer NOT NULL DEFAULT 0,
    prompt_tokens bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    cost_usd double precision NOT NULL DEFAULT 0
);
CREATE INDEX requests_in_flight_key ON requests_in_flight (key_id);
CREATE INDEX requests_in_flight_expires ON requests_in_flight (expires_at);
