-- One row per request the gateway accepted (failed ones too), one row per upstream call (a "leg").
CREATE TABLE requests (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,            -- unix seconds
    key_id TEXT,                         -- sha256 prefix of the API key, never the key
    policy TEXT,
    alias TEXT,                          -- the model the client asked for
    route TEXT,                          -- direct | rag | long | rag>long | passthrough | none
    reason TEXT,
    status INTEGER NOT NULL,             -- HTTP status returned to the client
    error TEXT,
    stream INTEGER NOT NULL DEFAULT 0,
    latency_ms REAL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    context_tokens INTEGER NOT NULL DEFAULT 0,      -- tokens of the whole context (documents + prompt)
    counterfactual_cost_usd REAL NOT NULL DEFAULT 0, -- what always-long-context would have cost
    provenance TEXT                      -- JSON: documents, sections, chunks used
);
CREATE INDEX requests_created_at ON requests (created_at);
CREATE INDEX requests_route_created_at ON requests (route, created_at);
CREATE INDEX requests_key_created_at ON requests (key_id, created_at);
CREATE INDEX requests_policy_created_at ON requests (policy, created_at);
CREATE INDEX requests_status_created_at ON requests (status, created_at);

CREATE TABLE upstream_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL REFERENCES requests (id),
    created_at REAL NOT NULL,
    model TEXT NOT NULL,
    route TEXT,                          -- the leg's route: direct | rag | long | passthrough
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    latency_ms REAL,
    error TEXT
);
CREATE INDEX upstream_calls_request_id ON upstream_calls (request_id);
CREATE INDEX upstream_calls_model_created_at ON upstream_calls (model, created_at);
