-- What the router learns from: per routed request, the features and scores its decisions were made on
-- (request_features), and labels of its cheap answers (labels) from the judge, shadow answers and client feedback.
-- No foreign keys to requests: a request row is replaced whole when it is re-submitted (INSERT OR REPLACE), and its
-- features row is written in the same transaction as the request row (gateway.ledger.database.write_records).
CREATE TABLE request_features (
    request_id TEXT PRIMARY KEY,         -- requests.id
    created_at REAL NOT NULL,
    version INTEGER NOT NULL,            -- the layout of data (gateway.routing.learning.features_record)
    data TEXT NOT NULL                   -- JSON: pre-route features, verifier features, P(cheap), P(good), decision,
                                         -- thresholds; texts only when the policy sets ledger.store_texts
);
CREATE INDEX request_features_created_at ON request_features (created_at);

CREATE TABLE labels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,            -- the routed request whose cheap answer is labelled (requests.id)
    created_at REAL NOT NULL,
    source TEXT NOT NULL,                -- judge (on an escalation) | shadow (a background long answer, then the judge) | feedback
    key_id TEXT,                         -- the key of the labelled request (feedback: the key that sent it)
    verdict TEXT,                        -- judge: as_good | worse | both_wrong; feedback: good | bad
    good INTEGER NOT NULL,               -- 1: the cheap answer was good enough (no gain from the long route), 0: it was not
    score REAL,                          -- feedback's graded score (0..1), if given
    cost_usd REAL NOT NULL DEFAULT 0,    -- what this label cost (shadow and judge legs)
    label_request_id TEXT                -- the ledgered judge request that produced it (route judge), if any
);
CREATE INDEX labels_request_id ON labels (request_id);
CREATE INDEX labels_created_at ON labels (created_at);
