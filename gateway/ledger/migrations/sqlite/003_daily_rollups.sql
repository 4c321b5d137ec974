-- Daily rollups on top of the hourly ones: a busy gateway has nearly one hourly row per request when keys,
-- policies, routes and statuses combine, so all-time reports read these (one row per day and group) instead.
-- Kept by triggers on the hourly tables: each hourly change adds its difference to the day (UTC).
-- Also hourly latency histograms (at the end), so percentiles need not read every request.
CREATE TABLE request_rollup_daily (
    day INTEGER NOT NULL,                -- CAST(created_at / 86400 AS INTEGER) = hour / 24
    route TEXT NOT NULL,
    policy TEXT NOT NULL,
    key_id TEXT NOT NULL,
    status INTEGER NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    context_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    counterfactual_cost_usd REAL NOT NULL DEFAULT 0,
    latency_ms_sum REAL NOT NULL DEFAULT 0,
    latency_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, route, policy, key_id, status)
) WITHOUT ROWID;

CREATE TABLE call_rollup_daily (
    day INTEGER NOT NULL,
    model TEXT NOT NULL,
    route TEXT NOT NULL,
    policy TEXT NOT NULL,
    key_id TEXT NOT NULL,
    status INTEGER NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    latency_ms_sum REAL NOT NULL DEFAULT 0,
    latency_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, model, route, policy, key_id, status)
) WITHOUT ROWID;

INSERT INTO request_rollup_daily
SELECT hour / 24, route, policy, key_id, status, sum(requests), sum(prompt_tokens), sum(completion_tokens),
       sum(context_tokens), sum(cost_usd), sum(counterfactual_cost_usd), sum(latency_ms_sum), sum(latency_count)
FROM request_rollup_hourly GROUP BY 1, 2, 3, 4, 5;

INSERT INTO call_rollup_daily
SELECT hour / 24, model, route, policy, key_id, status, sum(calls), sum(errors), sum(prompt_tokens),
       sum(completion_tokens), sum(cost_usd), sum(latency_ms_sum), sum(latency_count)
FROM call_rollup_hourly GROUP BY 1, 2, 3, 4, 5, 6;

CREATE TRIGGER request_rollup_daily_insert AFTER INSERT ON request_rollup_hourly
BEGIN
    INSERT INTO request_rollup_daily VALUES (NEW.hour / 24, NEW.route, NEW.policy, NEW.key_id, NEW.status,
        NEW.requests, NEW.prompt_tokens, NEW.completion_tokens, NEW.context_tokens, NEW.cost_usd,
        NEW.counterfactual_cost_usd, NEW.latency_ms_sum, NEW.latency_count)
    ON CONFLICT (day, route, policy, key_id, status) DO UPDATE SET
        requests = requests + excluded.requests,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        context_tokens = context_tokens + excluded.context_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        counterfactual_cost_usd = counterfactual_cost_usd + excluded.counterfactual_cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count;
END;

CREATE TRIGGER request_rollup_daily_update AFTER UPDATE ON request_rollup_hourly
BEGIN
    UPDATE request_rollup_daily SET
        requests = requests + NEW.requests - OLD.requests,
        prompt_tokens = prompt_tokens + NEW.prompt_tokens - OLD.prompt_tokens,
        completion_tokens = completion_tokens + NEW.completion_tokens - OLD.completion_tokens,
        context_tokens = context_tokens + NEW.context_tokens - OLD.context_tokens,
        cost_usd = cost_usd + NEW.cost_usd - OLD.cost_usd,
        counterfactual_cost_usd = counterfactual_cost_usd + NEW.counterfactual_cost_usd - OLD.counterfactual_cost_usd,
        latency_ms_sum = latency_ms_sum + NEW.latency_ms_sum - OLD.latency_ms_sum,
        latency_count = latency_count + NEW.latency_count - OLD.latency_count
    WHERE day = NEW.hour / 24 AND route = NEW.route AND policy = NEW.policy AND key_id = NEW.key_id
      AND status = NEW.status;
END;

CREATE TRIGGER call_rollup_daily_insert AFTER INSERT ON call_rollup_hourly
BEGIN
    INSERT INTO call_rollup_daily VALUES (NEW.hour / 24, NEW.model, NEW.route, NEW.policy, NEW.key_id, NEW.status,
        NEW.calls, NEW.errors, NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd, NEW.latency_ms_sum,
        NEW.latency_count)
    ON CONFLICT (day, model, route, policy, key_id, status) DO UPDATE SET
        calls = calls + excluded.calls,
        errors = errors + excluded.errors,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count;
END;

CREATE TRIGGER call_rollup_daily_update AFTER UPDATE ON call_rollup_hourly
BEGIN
    UPDATE call_rollup_daily SET
        calls = calls + NEW.calls - OLD.calls,
        errors = errors + NEW.errors - OLD.errors,
        prompt_tokens = prompt_tokens + NEW.prompt_tokens - OLD.prompt_tokens,
        completion_tokens = completion_tokens + NEW.completion_tokens - OLD.completion_tokens,
        cost_usd = cost_usd + NEW.cost_usd - OLD.cost_usd,
        latency_ms_sum = latency_ms_sum + NEW.latency_ms_sum - OLD.latency_ms_sum,
        latency_count = latency_count + NEW.latency_count - OLD.latency_count
    WHERE day = NEW.hour / 24 AND model = NEW.model AND route = NEW.route AND policy = NEW.policy
      AND key_id = NEW.key_id AND status = NEW.status;
END;

-- Request latency histograms per hour and route, for percentiles without reading every request.
-- A latency falls in the first bucket whose upper bound is >= it (Prometheus-style "le" buckets).
CREATE TABLE latency_buckets (
    bucket INTEGER PRIMARY KEY,
    upper_ms REAL NOT NULL UNIQUE
);
INSERT INTO latency_buckets (bucket, upper_ms) VALUES
    (0, 5), (1, 10), (2, 20), (3, 30), (4, 50), (5, 75), (6, 100), (7, 150), (8, 200), (9, 250), (10, 300),
    (11, 400), (12, 500), (13, 600), (14, 750), (15, 1000), (16, 1250), (17, 1500), (18, 2000), (19, 2500),
    (20, 3000), (21, 4000), (22, 5000), (23, 6000), (24, 7500), (25, 10000), (26, 12500), (27, 15000),
    (28, 20000), (29, 30000), (30, 45000), (31, 60000), (32, 90000), (33, 120000), (34, 180000), (35, 300000),
    (36, 600000), (37, 1e300);

CREATE TABLE latency_rollup_hourly (
    hour INTEGER NOT NULL,
    route TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, route, bucket)
) WITHOUT ROWID;

INSERT INTO latency_rollup_hourly
SELECT CAST(r.created_at / 3600 AS INTEGER), coalesce(r.route, ''),
       (SELECT b.bucket FROM latency_buckets b WHERE b.upper_ms >= r.latency_ms ORDER BY b.upper_ms LIMIT 1), count(*)
FROM requests r WHERE r.latency_ms IS NOT NULL GROUP BY 1, 2, 3;

CREATE TRIGGER latency_rollup_insert AFTER INSERT ON requests WHEN NEW.latency_ms IS NOT NULL
BEGIN
    INSERT INTO latency_rollup_hourly (hour, route, bucket, requests)
    VALUES (CAST(NEW.created_at / 3600 AS INTEGER), coalesce(NEW.route, ''),
            (SELECT bucket FROM latency_buckets WHERE upper_ms >= NEW.latency_ms ORDER BY upper_ms LIMIT 1), 1)
    ON CONFLICT (hour, route, bucket) DO UPDATE SET requests = requests + 1;
END;

-- REPLACE fires no DELETE trigger (see 002): take the replaced row's latency out first.
CREATE TRIGGER latency_rollup_replace BEFORE INSERT ON requests
WHEN EXISTS (SELECT 1 FROM requests WHERE id = NEW.id AND latency_ms IS NOT NULL)
BEGIN
    UPDATE latency_rollup_hourly SET requests = requests - 1
    FROM (SELECT created_at, route, latency_ms FROM requests WHERE id = NEW.id) AS prev
    WHERE latency_rollup_hourly.hour = CAST(prev.created_at / 3600 AS INTEGER)
      AND latency_rollup_hourly.route = coalesce(prev.route, '')
      AND latency_rollup_hourly.bucket = (SELECT bucket FROM latency_buckets WHERE upper_ms >= prev.latency_ms
                                          ORDER BY upper_ms LIMIT 1);
END;

CREATE TRIGGER latency_rollup_delete AFTER DELETE ON requests WHEN OLD.latency_ms IS NOT NULL
BEGIN
    UPDATE latency_rollup_hourly SET requests = requests - 1
    WHERE hour = CAST(OLD.created_at / 3600 AS INTEGER) AND route = coalesce(OLD.route, '')
      AND bucket = (SELECT bucket FROM latency_buckets WHERE upper_ms >= OLD.latency_ms ORDER BY upper_ms LIMIT 1);
END;
