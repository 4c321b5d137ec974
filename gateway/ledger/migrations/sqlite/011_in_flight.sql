-- Requests in flight: written before a request's first upstream call, deleted in the same transaction that writes
-- its finished row. Each row is also the request's reservation: its estimated cost and tokens count against the
-- key's budget and TPM until the finished row replaces it (gateway/ledger/budget.py). A row whose process died
-- (kill -9) becomes a requests row charged at the estimate once its owner is gone or its lease ends.
CREATE TABLE requests_in_flight (
    request_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,            -- unix seconds: the request's start, as requests.created_at
    expires_at REAL NOT NULL,            -- the lease: past it, a row nobody finished is charged at its estimate
    owner TEXT NOT NULL,                 -- host:pid of the gateway process serving it
    key_id TEXT,
    policy TEXT,
    alias TEXT,
    stream INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,      -- the estimate: prompt tokens
    completion_tokens INTEGER NOT NULL DEFAULT 0,  -- the estimate's bound on completion tokens
    cost_usd REAL NOT NULL DEFAULT 0               -- the estimate in USD (reserved against the key's budget)
);
CREATE INDEX requests_in_flight_key ON requests_in_flight (key_id);
CREATE INDEX requests_in_flight_expires ON requests_in_flight (expires_at);
