-- PostgreSQL twin of sqlite/004_keys.sql: named API keys (salted HMAC-SHA256 hashes, never the key),
-- collection ownership, and per-minute request counters for rate limits.
CREATE TABLE api_keys (
    name text PRIMARY KEY,                   -- also what the ledger records as the request's key_id
    prefix text NOT NULL,                    -- the key's first characters: how a presented key finds its row
    salt text NOT NULL,                      -- hex, random per key
    hash text NOT NULL,                      -- hex HMAC-SHA256(salt, key)
    models text,                             -- JSON list of fnmatch patterns; NULL: any model
    collections text,                        -- JSON list of collection names granted to the key
    budget_usd double precision,             -- NULL: no budget
    rpm integer,                             -- requests per minute; NULL: no limit
    tpm integer,                             -- tokens per minute; NULL: no limit
    created_at double precision NOT NULL,
    expires_at double precision,
    revoked_at double precision
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);

CREATE TABLE collection_owners (
    collection text PRIMARY KEY,
    owner text NOT NULL,                     -- a key's ledger id: a name, or k_... for env/file keys
    created_at double precision NOT NULL
);

CREATE TABLE rate_windows (
    key_id text NOT NULL,
    minute bigint NOT NULL,                  -- floor(unix seconds / 60)
    requests integer NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, minute)
);
