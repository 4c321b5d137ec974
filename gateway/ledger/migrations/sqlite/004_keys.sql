-- Named API keys, which collection belongs to which key, and per-minute request counters for rate limits.
-- A key is never stored: only a salted HMAC-SHA256 of it and its first characters (to recognise it in a list).
-- requests.key_id holds a named key's name (env and file keys keep their k_<sha256 prefix> id).
CREATE TABLE api_keys (
    name TEXT PRIMARY KEY,               -- also what the ledger records as the request's key_id
    prefix TEXT NOT NULL,                -- the key's first characters: how a presented key finds its row
    salt TEXT NOT NULL,                  -- hex, random per key
    hash TEXT NOT NULL,                  -- hex HMAC-SHA256(salt, key)
    models TEXT,                         -- JSON list of fnmatch patterns; NULL: any model
    collections TEXT,                    -- JSON list of collection names granted to the key
    budget_usd REAL,                     -- NULL: no budget
    rpm INTEGER,                         -- requests per minute; NULL: no limit
    tpm INTEGER,                         -- tokens per minute; NULL: no limit
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);

-- A collection belongs to the key that created it; other keys see it only through a grant.
CREATE TABLE collection_owners (
    collection TEXT PRIMARY KEY,
    owner TEXT NOT NULL,                 -- a key's ledger id: a name, or k_... for env/file keys
    created_at REAL NOT NULL
);

-- Requests admitted per key and minute, shared by every worker that opens this database.
CREATE TABLE rate_windows (
    key_id TEXT NOT NULL,
    minute INTEGER NOT NULL,             -- CAST(unix seconds / 60 AS INTEGER)
    requests INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, minute)
) WITHOUT ROWID;
