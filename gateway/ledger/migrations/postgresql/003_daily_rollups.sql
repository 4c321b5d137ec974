-- PostgreSQL twin of sqlite/003_daily_rollups.sql.
-- Daily rollups on top of the hourly ones: a busy gateway has nearly one hourly row per request when keys,
-- policies, routes and statuses combine, so all-time reports read these (one row per day and group) instead.
-- Kept by triggers on the hourly tables: each hourly change adds its difference to the day (UTC).
-- An upsert's DO UPDATE fires the hourly table's UPDATE triggers (not its INSERT ones), in both engines.
-- Also hourly latency histograms (at the end), so percentiles need not read every request.
CREATE TABLE request_rollup_daily (
    day bigint NOT NULL,                     -- floor(created_at / 86400) = hour / 24
    route text NOT NULL,
    policy text NOT NULL,
    key_id text NOT NULL,
    status integer NOT NULL,
    requests bigint NOT NULL DEFAULT 0,
    prompt_tokens bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    context_tokens bigint NOT NULL DEFAULT 0,
    cost_usd double precision NOT NULL DEFAULT 0,
    counterfactual_cost_usd double precision NOT NULL DEFAULT 0,
    latency_ms_sum double precision NOT NULL DEFAULT 0,
    latency_count bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (day, route, policy, key_id, status)
);

CREATE TABLE call_rollup_daily (
    day bigint NOT NULL,
    model text NOT NULL,
    route text NOT NULL,
    policy text NOT NULL,
    key_id text NOT NULL,
    status integer NOT NULL,
    calls bigint NOT NULL DEFAULT 0,
    errors bigint NOT NULL DEFAULT 0,
    prompt_tokens bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    cost_usd double precision NOT NULL DEFAULT 0,
    latency_ms_sum double precision NOT NULL DEFAULT 0,
    latency_count bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (day, model, route, policy, key_id, status)
);

-- hour / 24 is bigint division (truncating), like SQLite's INTEGER division
INSERT INTO request_rollup_daily
SELECT hour / 24, route, policy, key_id, status, sum(requests), sum(prompt_tokens), sum(completion_tokens),
       sum(context_tokens), sum(cost_usd), sum(counterfactual_cost_usd), sum(latency_ms_sum), sum(latency_count)
FROM request_rollup_hourly GROUP BY 1, 2, 3, 4, 5;

INSERT INTO call_rollup_daily
SELECT hour / 24, model, route, policy, key_id, status, sum(calls), sum(errors), sum(prompt_tokens),
       sum(completion_tokens), sum(cost_usd), sum(latency_ms_sum), sum(latency_count)
FROM call_rollup_hourly GROUP BY 1, 2, 3, 4, 5, 6;

CREATE FUNCTION request_rollup_daily_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO request_rollup_daily AS d VALUES (NEW.hour / 24, NEW.route, NEW.policy, NEW.key_id, NEW.status,
            NEW.requests, NEW.prompt_tokens, NEW.completion_tokens, NEW.context_tokens, NEW.cost_usd,
            NEW.counterfactual_cost_usd, NEW.latency_ms_sum, NEW.latency_count)
        ON CONFLICT (day, route, policy, key_id, status) DO UPDATE SET
            requests = d.requests + excluded.requests,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            context_tokens = d.context_tokens + excluded.context_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            counterfactual_cost_usd = d.counterfactual_cost_usd + excluded.counterfactual_cost_usd,
            latency_ms_sum = d.latency_ms_sum + excluded.latency_ms_sum,
            latency_count = d.latency_count + excluded.latency_count;
    ELSE
        UPDATE request_rollup_daily AS d SET
            requests = d.requests + NEW.requests - OLD.requests,
            prompt_tokens = d.prompt_tokens + NEW.prompt_tokens - OLD.prompt_tokens,
            completion_tokens = d.completion_tokens + NEW.completion_tokens - OLD.completion_tokens,
            context_tokens = d.context_tokens + NEW.context_tokens - OLD.context_tokens,
            cost_usd = d.cost_usd + NEW.cost_usd - OLD.cost_usd,
            counterfactual_cost_usd = d.counterfactual_cost_usd + NEW.counterfactual_cost_usd
                - OLD.counterfactual_cost_usd,
            latency_ms_sum = d.latency_ms_sum + NEW.latency_ms_sum - OLD.latency_ms_sum,
            latency_count = d.latency_count + NEW.latency_count - OLD.latency_count
        WHERE d.day = NEW.hour / 24 AND d.route = NEW.route AND d.policy = NEW.policy AND d.key_id = NEW.key_id
          AND d.status = NEW.status;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER request_rollup_daily_insert AFTER INSERT ON request_rollup_hourly
    FOR EACH ROW EXECUTE FUNCTION request_rollup_daily_trigger();
CREATE TRIGGER request_rollup_daily_update AFTER UPDATE ON request_rollup_hourly
    FOR EACH ROW EXECUTE FUNCTION request_rollup_daily_trigger();

CREATE FUNCTION call_rollup_daily_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO call_rollup_daily AS d VALUES (NEW.hour / 24, NEW.model, NEW.route, NEW.policy, NEW.key_id,
            NEW.status, NEW.calls, NEW.errors, NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd,
            NEW.latency_ms_sum, NEW.latency_count)
        ON CONFLICT (day, model, route, policy, key_id, status) DO UPDATE SET
            calls = d.calls + excluded.calls,
            errors = d.errors + excluded.errors,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            latency_ms_sum = d.latency_ms_sum + excluded.latency_ms_sum,
            latency_count = d.latency_count + excluded.latency_count;
    ELSE
        UPDATE call_rollup_daily AS d SET
            calls = d.calls + NEW.calls - OLD.calls,
            errors = d.errors + NEW.errors - OLD.errors,
            prompt_tokens = d.prompt_tokens + NEW.prompt_tokens - OLD.prompt_tokens,
            completion_tokens = d.completion_tokens + NEW.completion_tokens - OLD.completion_tokens,
            cost_usd = d.cost_usd + NEW.cost_usd - OLD.cost_usd,
            latency_ms_sum = d.latency_ms_sum + NEW.latency_ms_sum - OLD.latency_ms_sum,
            latency_count = d.latency_count + NEW.latency_count - OLD.latency_count
        WHERE d.day = NEW.hour / 24 AND d.model = NEW.model AND d.route = NEW.route AND d.policy = NEW.policy
          AND d.key_id = NEW.key_id AND d.status = NEW.status;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER call_rollup_daily_insert AFTER INSERT ON call_rollup_hourly
    FOR EACH ROW EXECUTE FUNCTION call_rollup_daily_trigger();
CREATE TRIGGER call_rollup_daily_update AFTER UPDATE ON call_rollup_hourly
    FOR EACH ROW EXECUTE FUNCTION call_rollup_daily_trigger();

-- Request latency histograms per hour and route, for percentiles without reading every request.
-- A latency falls in the first bucket whose upper bound is >= it (Prometheus-style "le" buckets).
CREATE TABLE latency_buckets (
    bucket integer PRIMARY KEY,
    upper_ms double precision NOT NULL UNIQUE
);
INSERT INTO latency_buckets (bucket, upper_ms) VALUES
    (0, 5), (1, 10), (2, 20), (3, 30), (4, 50), (5, 75), (6, 100), (7, 150), (8, 200), (9, 250), (10, 300),
    (11, 400), (12, 500), (13, 600), (14, 750), (15, 1000), (16, 1250), (17, 1500), (18, 2000), (19, 2500),
    (20, 3000), (21, 4000), (22, 5000), (23, 6000), (24, 7500), (25, 10000), (26, 12500), (27, 15000),
    (28, 20000), (29, 30000), (30, 45000), (31, 60000), (32, 90000), (33, 120000), (34, 180000), (35, 300000),
    (36, 600000), (37, 1e300);

CREATE TABLE latency_rollup_hourly (
    hour bigint NOT NULL,
    route text NOT NULL,
    bucket integer NOT NULL,
    requests bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, route, bucket)
);

INSERT INTO latency_rollup_hourly
SELECT floor(r.created_at / 3600)::bigint, coalesce(r.route, ''),
       (SELECT b.bucket FROM latency_buckets b WHERE b.upper_ms >= r.latency_ms ORDER BY b.upper_ms LIMIT 1), count(*)
FROM requests r WHERE r.latency_ms IS NOT NULL GROUP BY 1, 2, 3;

-- INSERT adds NEW, DELETE takes OLD out, UPDATE (INSERT ... ON CONFLICT DO UPDATE re-writes) does both.
CREATE FUNCTION latency_rollup_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.latency_ms IS NOT NULL THEN
        UPDATE latency_rollup_hourly AS l SET requests = l.requests - 1
        WHERE l.hour = floor(OLD.created_at / 3600)::bigint AND l.route = coalesce(OLD.route, '')
          AND l.bucket = (SELECT b.bucket FROM latency_buckets b WHERE b.upper_ms >= OLD.latency_ms
                          ORDER BY b.upper_ms LIMIT 1);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.latency_ms IS NOT NULL THEN
        INSERT INTO latency_rollup_hourly AS l (hour, route, bucket, requests)
        VALUES (floor(NEW.created_at / 3600)::bigint, coalesce(NEW.route, ''),
                (SELECT b.bucket FROM latency_buckets b WHERE b.upper_ms >= NEW.latency_ms
                 ORDER BY b.upper_ms LIMIT 1), 1)
        ON CONFLICT (hour, route, bucket) DO UPDATE SET requests = l.requests + 1;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER latency_rollup_insert AFTER INSERT ON requests
    FOR EACH ROW WHEN (NEW.latency_ms IS NOT NULL) EXECUTE FUNCTION latency_rollup_trigger();
CREATE TRIGGER latency_rollup_update AFTER UPDATE ON requests
    FOR EACH ROW WHEN (OLD.latency_ms IS NOT NULL OR NEW.latency_ms IS NOT NULL)
    EXECUTE FUNCTION latency_rollup_trigger();
CREATE TRIGGER latency_rollup_delete AFTER DELETE ON requests
    FOR EACH ROW WHEN (OLD.latency_ms IS NOT NULL) EXECUTE FUNCTION latency_rollup_trigger();
