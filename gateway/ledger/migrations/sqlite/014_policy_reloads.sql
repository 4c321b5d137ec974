-- The policy reload across workers and replicas (gateway/ledger/reloads.py). POST /v1/admin/reload adds a
-- generation once the process that took the call has loaded the policy file's models; every serving process on
-- this ledger reads the newest generation every few seconds, off the request path, and reloads its own models.
CREATE TABLE policy_reloads (
    generation INTEGER PRIMARY KEY AUTOINCREMENT,
    requested_at REAL NOT NULL,
    requested_by TEXT NOT NULL,              -- the process that took the call (gateway_processes.id)
    policy_sha256 TEXT                       -- the policy file it loaded
);

-- What each serving process has in force, written by the process itself when it starts, after each reload and
-- every minute: the generation it acted on last, and (JSON) the model files' sha256 and the thresholds in force,
-- the generation they came with, the last reload error.
CREATE TABLE gateway_processes (
    id TEXT PRIMARY KEY,                     -- host:pid:start time
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    generation INTEGER NOT NULL,
    state TEXT NOT NULL
);
