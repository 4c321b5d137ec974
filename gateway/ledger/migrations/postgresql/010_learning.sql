-- PostgreSQL twin of sqlite/010_learning.sql: features per routed request and labels of cheap answers.
CREATE TABLE request_features (
    request_id text PRIMARY KEY,
    created_at double precision NOT NULL,
    version integer NOT NULL,
    data text NOT NULL                       -- JSON (text, like requests.provenance)
);
CREATE INDEX request_features_created_at ON request_features (created_at);

CREATE TABLE labels (
    id bigserial PRIMARY KEY,
    request_id text NOT NULL,
    created_at double precision NOT NULL,
    source text NOT NULL,
    key_id text,
    verdict text,
    good integer NOT NULL,
    score double precision,
    cost_usd double precision NOT NULL DEFAULT 0,
    label_request_id text
);
CREATE INDEX labels_request_id ON labels (request_id);
CREATE INDEX labels_created_at ON labels (created_at);
