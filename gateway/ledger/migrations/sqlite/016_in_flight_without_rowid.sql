-- requests_in_flight as one b-tree keyed by request_id (WITHOUT ROWID: before, a rowid table plus its primary key's
-- index, two b-trees for each insert and delete), and without the index on expires_at, which no query used
-- (abandoned rows are found by reading the whole table, which holds only what is in flight). Every request inserts
-- one row here and deletes it: the pages each commit writes (BENCHMARKS.md section 1, round nine).
CREATE TABLE requests_in_flight_016 (
    request_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    owner TEXT NOT NULL,
    key_id TEXT,
    policy TEXT,
    alias TEXT,
    stream INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0
) WITHOUT ROWID;
INSERT INTO requests_in_flight_016 SELECT request_id, created_at, expires_at, owner, key_id, policy, alias, stream,
    prompt_tokens, completion_tokens, cost_usd FROM requests_in_flight;
DROP TABLE requests_in_flight;
ALTER TABLE requests_in_flight_016 RENAME TO requests_in_flight;
CREATE INDEX requests_in_flight_key ON requests_in_flight (key_id);
