-- PostgreSQL twin of sqlite/008_rollup_cache_columns.sql: the provider prompt cache's figures (hits, cached prompt
-- tokens, saving) in the request and call rollups, so `costs` no longer sums them from the raw rows; 007's
-- cache_rollup_hourly is superseded (the dashboard reads the call rollups per route).
DROP TRIGGER cache_rollup_insert ON upstream_calls;
DROP TRIGGER cache_rollup_update ON upstream_calls;
DROP TRIGGER cache_rollup_delete ON upstream_calls;
DROP TRIGGER cache_rollup_move ON requests;
DROP FUNCTION cache_rollup_call_trigger();
DROP FUNCTION cache_rollup_request_trigger();
DROP FUNCTION cache_rollup_add(upstream_calls, requests);
DROP FUNCTION cache_rollup_sub(upstream_calls, requests);
DROP TABLE cache_rollup_hourly;
-- re-created below: the backfill's hourly UPDATEs must not pass through the days (the days are backfilled apart)
DROP TRIGGER request_rollup_daily_update ON request_rollup_hourly;
DROP TRIGGER call_rollup_daily_update ON call_rollup_hourly;

ALTER TABLE request_rollup_hourly ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0;       -- requests that read it
ALTER TABLE request_rollup_hourly ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_hourly ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_daily ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_daily ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_daily ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_hourly ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0;          -- legs that read it
ALTER TABLE call_rollup_hourly ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_hourly ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_daily ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_daily ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_daily ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;

UPDATE request_rollup_hourly AS h SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT floor(created_at / 3600)::bigint AS hour, coalesce(route, '') AS route,
             coalesce(policy, '') AS policy, coalesce(key_id, '') AS key_id, status,
             count(CASE WHEN cached_tokens > 0 THEN 1 END) AS hits, sum(cached_tokens) AS tokens,
             sum(cache_saving_usd) AS saving
      FROM requests WHERE cached_tokens <> 0 OR cache_saving_usd <> 0 GROUP BY 1, 2, 3, 4, 5) AS f
WHERE h.hour = f.hour AND h.route = f.route AND h.policy = f.policy AND h.key_id = f.key_id AND h.status = f.status;

UPDATE call_rollup_hourly AS h SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT floor(r.created_at / 3600)::bigint AS hour, c.model AS model, coalesce(r.route, '') AS route,
             coalesce(r.policy, '') AS policy, coalesce(r.key_id, '') AS key_id, r.status AS status,
             count(CASE WHEN c.cached_tokens > 0 THEN 1 END) AS hits, sum(c.cached_tokens) AS tokens,
             sum(c.cache_saving_usd) AS saving
      FROM upstream_calls c JOIN requests r ON r.id = c.request_id
      WHERE c.cached_tokens <> 0 OR c.cache_saving_usd <> 0 GROUP BY 1, 2, 3, 4, 5, 6) AS f
WHERE h.hour = f.hour AND h.model = f.model AND h.route = f.route AND h.policy = f.policy AND h.key_id = f.key_id
  AND h.status = f.status;

UPDATE request_rollup_daily AS d SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT hour / 24 AS day, route, policy, key_id, status, sum(cache_hits) AS hits,
             sum(cached_tokens) AS tokens, sum(cache_saving_usd) AS saving
      FROM request_rollup_hourly WHERE cache_hits <> 0 OR cached_tokens <> 0 OR cache_saving_usd <> 0
      GROUP BY 1, 2, 3, 4, 5) AS f
WHERE d.day = f.day AND d.route = f.route AND d.policy = f.policy AND d.key_id = f.key_id AND d.status = f.status;

UPDATE call_rollup_daily AS d SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT hour / 24 AS day, model, route, policy, key_id, status, sum(cache_hits) AS hits,
             sum(cached_tokens) AS tokens, sum(cache_saving_usd) AS saving
      FROM call_rollup_hourly WHERE cache_hits <> 0 OR cached_tokens <> 0 OR cache_saving_usd <> 0
      GROUP BY 1, 2, 3, 4, 5, 6) AS f
WHERE d.day = f.day AND d.model = f.model AND d.route = f.route AND d.policy = f.policy AND d.key_id = f.key_id
  AND d.status = f.status;

-- 002's functions, with the cache columns (the triggers that call them stay)
CREATE OR REPLACE FUNCTION request_rollup_add(r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO request_rollup_hourly AS h (hour, route, policy, key_id, status, requests, prompt_tokens,
        completion_tokens, context_tokens, cost_usd, counterfactual_cost_usd, latency_ms_sum, latency_count,
        cache_hits, cached_tokens, cache_saving_usd)
    VALUES (floor(r.created_at / 3600)::bigint, coalesce(r.route, ''), coalesce(r.policy, ''),
        coalesce(r.key_id, ''), r.status, 1, r.prompt_tokens, r.completion_tokens, r.context_tokens,
        r.cost_usd, r.counterfactual_cost_usd, coalesce(r.latency_ms, 0), (r.latency_ms IS NOT NULL)::int,
        (r.cached_tokens > 0)::int, r.cached_tokens, r.cache_saving_usd)
    ON CONFLICT (hour, route, policy, key_id, status) DO UPDATE SET
        requests = h.requests + 1,
        prompt_tokens = h.prompt_tokens + excluded.prompt_tokens,
        completion_tokens = h.completion_tokens + excluded.completion_tokens,
        context_tokens = h.context_tokens + excluded.context_tokens,
        cost_usd = h.cost_usd + excluded.cost_usd,
        counterfactual_cost_usd = h.counterfactual_cost_usd + excluded.counterfactual_cost_usd,
        latency_ms_sum = h.latency_ms_sum + excluded.latency_ms_sum,
        latency_count = h.latency_count + excluded.latency_count,
        cache_hits = h.cache_hits + excluded.cache_hits,
        cached_tokens = h.cached_tokens + excluded.cached_tokens,
        cache_saving_usd = h.cache_saving_usd + excluded.cache_saving_usd;
END $$;

CREATE OR REPLACE FUNCTION request_rollup_sub(r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE request_rollup_hourly AS h SET
        requests = h.requests - 1,
        prompt_tokens = h.prompt_tokens - r.prompt_tokens,
        completion_tokens = h.completion_tokens - r.completion_tokens,
        context_tokens = h.context_tokens - r.context_tokens,
        cost_usd = h.cost_usd - r.cost_usd,
        counterfactual_cost_usd = h.counterfactual_cost_usd - r.counterfactual_cost_usd,
        latency_ms_sum = h.latency_ms_sum - coalesce(r.latency_ms, 0),
        latency_count = h.latency_count - (r.latency_ms IS NOT NULL)::int,
        cache_hits = h.cache_hits - (r.cached_tokens > 0)::int,
        cached_tokens = h.cached_tokens - r.cached_tokens,
        cache_saving_usd = h.cache_saving_usd - r.cache_saving_usd
    WHERE h.hour = floor(r.created_at / 3600)::bigint AND h.route = coalesce(r.route, '')
      AND h.policy = coalesce(r.policy, '') AND h.key_id = coalesce(r.key_id, '') AND h.status = r.status;
END $$;

CREATE OR REPLACE FUNCTION call_rollup_add(c upstream_calls, r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO call_rollup_hourly AS h (hour, model, route, policy, key_id, status, calls, errors, prompt_tokens,
        completion_tokens, cost_usd, latency_ms_sum, latency_count, cache_hits, cached_tokens, cache_saving_usd)
    VALUES (floor(r.created_at / 3600)::bigint, c.model, coalesce(r.route, ''), coalesce(r.policy, ''),
        coalesce(r.key_id, ''), r.status, 1, (c.error IS NOT NULL)::int, c.prompt_tokens, c.completion_tokens,
        c.cost_usd, coalesce(c.latency_ms, 0), (c.latency_ms IS NOT NULL)::int, (c.cached_tokens > 0)::int,
        c.cached_tokens, c.cache_saving_usd)
    ON CONFLICT (hour, model, route, policy, key_id, status) DO UPDATE SET
        calls = h.calls + 1,
        errors = h.errors + excluded.errors,
        prompt_tokens = h.prompt_tokens + excluded.prompt_tokens,
        completion_tokens = h.completion_tokens + excluded.completion_tokens,
        cost_usd = h.cost_usd + excluded.cost_usd,
        latency_ms_sum = h.latency_ms_sum + excluded.latency_ms_sum,
        latency_count = h.latency_count + excluded.latency_count,
        cache_hits = h.cache_hits + excluded.cache_hits,
        cached_tokens = h.cached_tokens + excluded.cached_tokens,
        cache_saving_usd = h.cache_saving_usd + excluded.cache_saving_usd;
END $$;

CREATE OR REPLACE FUNCTION call_rollup_sub(c upstream_calls, r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE call_rollup_hourly AS h SET
        calls = h.calls - 1,
        errors = h.errors - (c.error IS NOT NULL)::int,
        prompt_tokens = h.prompt_tokens - c.prompt_tokens,
        completion_tokens = h.completion_tokens - c.completion_tokens,
        cost_usd = h.cost_usd - c.cost_usd,
        latency_ms_sum = h.latency_ms_sum - coalesce(c.latency_ms, 0),
        latency_count = h.latency_count - (c.latency_ms IS NOT NULL)::int,
        cache_hits = h.cache_hits - (c.cached_tokens > 0)::int,
        cached_tokens = h.cached_tokens - c.cached_tokens,
        cache_saving_usd = h.cache_saving_usd - c.cache_saving_usd
    WHERE h.hour = floor(r.created_at / 3600)::bigint AND h.model = c.model AND h.route = coalesce(r.route, '')
      AND h.policy = coalesce(r.policy, '') AND h.key_id = coalesce(r.key_id, '') AND h.status = r.status;
END $$;

-- 003's functions, with the cache columns
CREATE OR REPLACE FUNCTION request_rollup_daily_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO request_rollup_daily AS d (day, route, policy, key_id, status, requests, prompt_tokens,
            completion_tokens, context_tokens, cost_usd, counterfactual_cost_usd, latency_ms_sum, latency_count,
            cache_hits, cached_tokens, cache_saving_usd)
        VALUES (NEW.hour / 24, NEW.route, NEW.policy, NEW.key_id, NEW.status, NEW.requests, NEW.prompt_tokens,
            NEW.completion_tokens, NEW.context_tokens, NEW.cost_usd, NEW.counterfactual_cost_usd, NEW.latency_ms_sum,
            NEW.latency_count, NEW.cache_hits, NEW.cached_tokens, NEW.cache_saving_usd)
        ON CONFLICT (day, route, policy, key_id, status) DO UPDATE SET
            requests = d.requests + excluded.requests,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            context_tokens = d.context_tokens + excluded.context_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            counterfactual_cost_usd = d.counterfactual_cost_usd + excluded.counterfactual_cost_usd,
            latency_ms_sum = d.latency_ms_sum + excluded.latency_ms_sum,
            latency_count = d.latency_count + excluded.latency_count,
            cache_hits = d.cache_hits + excluded.cache_hits,
            cached_tokens = d.cached_tokens + excluded.cached_tokens,
            cache_saving_usd = d.cache_saving_usd + excluded.cache_saving_usd;
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
            latency_count = d.latency_count + NEW.latency_count - OLD.latency_count,
            cache_hits = d.cache_hits + NEW.cache_hits - OLD.cache_hits,
            cached_tokens = d.cached_tokens + NEW.cached_tokens - OLD.cached_tokens,
            cache_saving_usd = d.cache_saving_usd + NEW.cache_saving_usd - OLD.cache_saving_usd
        WHERE d.day = NEW.hour / 24 AND d.route = NEW.route AND d.policy = NEW.policy AND d.key_id = NEW.key_id
          AND d.status = NEW.status;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION call_rollup_daily_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO call_rollup_daily AS d (day, model, route, policy, key_id, status, calls, errors, prompt_tokens,
            completion_tokens, cost_usd, latency_ms_sum, latency_count, cache_hits, cached_tokens, cache_saving_usd)
        VALUES (NEW.hour / 24, NEW.model, NEW.route, NEW.policy, NEW.key_id, NEW.status, NEW.calls, NEW.errors,
            NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd, NEW.latency_ms_sum, NEW.latency_count,
            NEW.cache_hits, NEW.cached_tokens, NEW.cache_saving_usd)
        ON CONFLICT (day, model, route, policy, key_id, status) DO UPDATE SET
            calls = d.calls + excluded.calls,
            errors = d.errors + excluded.errors,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            latency_ms_sum = d.latency_ms_sum + excluded.latency_ms_sum,
            latency_count = d.latency_count + excluded.latency_count,
            cache_hits = d.cache_hits + excluded.cache_hits,
            cached_tokens = d.cached_tokens + excluded.cached_tokens,
            cache_saving_usd = d.cache_saving_usd + excluded.cache_saving_usd;
    ELSE
        UPDATE call_rollup_daily AS d SET
            calls = d.calls + NEW.calls - OLD.calls,
            errors = d.errors + NEW.errors - OLD.errors,
            prompt_tokens = d.prompt_tokens + NEW.prompt_tokens - OLD.prompt_tokens,
            completion_tokens = d.completion_tokens + NEW.completion_tokens - OLD.completion_tokens,
            cost_usd = d.cost_usd + NEW.cost_usd - OLD.cost_usd,
            latency_ms_sum = d.latency_ms_sum + NEW.latency_ms_sum - OLD.latency_ms_sum,
            latency_count = d.latency_count + NEW.latency_count - OLD.latency_count,
            cache_hits = d.cache_hits + NEW.cache_hits - OLD.cache_hits,
            cached_tokens = d.cached_tokens + NEW.cached_tokens - OLD.cached_tokens,
            cache_saving_usd = d.cache_saving_usd + NEW.cache_saving_usd - OLD.cache_saving_usd
        WHERE d.day = NEW.hour / 24 AND d.model = NEW.model AND d.route = NEW.route AND d.policy = NEW.policy
          AND d.key_id = NEW.key_id AND d.status = NEW.status;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER request_rollup_daily_update AFTER UPDATE ON request_rollup_hourly
    FOR EACH ROW EXECUTE FUNCTION request_rollup_daily_trigger();
CREATE TRIGGER call_rollup_daily_update AFTER UPDATE ON call_rollup_hourly
    FOR EACH ROW EXECUTE FUNCTION call_rollup_daily_trigger();

-- 005's partial indexes served the raw-row sums the rollups replace (dropped after the backfill, which used them)
DROP INDEX requests_cached_created_at;
DROP INDEX upstream_calls_cached_request_id;
