-- Provider prompt caching in the request and call rollups (002, 003): per group, the requests (or legs) that read
-- the provider's cache, the prompt tokens read from it and what caching saved. `costs` and /v1/admin/costs summed
-- these from the raw rows (005's partial indexes), which took a second on a million-request ledger where most
-- long calls hit the cache; they now come with every other sum. This supersedes 007's cache_rollup_hourly: the
-- dashboard's cache panel reads the call rollups per route instead.
-- The rollup triggers are re-created with the three columns added; the same floating-point operations in the
-- same order as before for the other columns.
DROP TRIGGER cache_rollup_insert;
DROP TRIGGER cache_rollup_delete;
DROP TABLE cache_rollup_hourly;
DROP TRIGGER request_rollup_insert;
DROP TRIGGER request_rollup_replace;
DROP TRIGGER request_rollup_delete;
DROP TRIGGER call_rollup_insert;
DROP TRIGGER call_rollup_delete;
DROP TRIGGER request_rollup_daily_insert;
DROP TRIGGER request_rollup_daily_update;
DROP TRIGGER call_rollup_daily_insert;
DROP TRIGGER call_rollup_daily_update;

ALTER TABLE request_rollup_hourly ADD COLUMN cache_hits INTEGER NOT NULL DEFAULT 0;     -- requests that read it
ALTER TABLE request_rollup_hourly ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_hourly ADD COLUMN cache_saving_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_daily ADD COLUMN cache_hits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_daily ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE request_rollup_daily ADD COLUMN cache_saving_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_hourly ADD COLUMN cache_hits INTEGER NOT NULL DEFAULT 0;        -- legs that read it
ALTER TABLE call_rollup_hourly ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_hourly ADD COLUMN cache_saving_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_daily ADD COLUMN cache_hits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_daily ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE call_rollup_daily ADD COLUMN cache_saving_usd REAL NOT NULL DEFAULT 0;

-- Backfill from the rows caching touched (005's partial indexes), the days from their hours.
UPDATE request_rollup_hourly SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT CAST(created_at / 3600 AS INTEGER) AS hour, coalesce(route, '') AS route,
             coalesce(policy, '') AS policy, coalesce(key_id, '') AS key_id, status,
             count(CASE WHEN cached_tokens > 0 THEN 1 END) AS hits, sum(cached_tokens) AS tokens,
             sum(cache_saving_usd) AS saving
      FROM requests WHERE cached_tokens <> 0 OR cache_saving_usd <> 0 GROUP BY 1, 2, 3, 4, 5) AS f
WHERE request_rollup_hourly.hour = f.hour AND request_rollup_hourly.route = f.route
  AND request_rollup_hourly.policy = f.policy AND request_rollup_hourly.key_id = f.key_id
  AND request_rollup_hourly.status = f.status;

UPDATE call_rollup_hourly SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT CAST(r.created_at / 3600 AS INTEGER) AS hour, c.model AS model, coalesce(r.route, '') AS route,
             coalesce(r.policy, '') AS policy, coalesce(r.key_id, '') AS key_id, r.status AS status,
             count(CASE WHEN c.cached_tokens > 0 THEN 1 END) AS hits, sum(c.cached_tokens) AS tokens,
             sum(c.cache_saving_usd) AS saving
      FROM upstream_calls c JOIN requests r ON r.id = c.request_id
      WHERE c.cached_tokens <> 0 OR c.cache_saving_usd <> 0 GROUP BY 1, 2, 3, 4, 5, 6) AS f
WHERE call_rollup_hourly.hour = f.hour AND call_rollup_hourly.model = f.model AND call_rollup_hourly.route = f.route
  AND call_rollup_hourly.policy = f.policy AND call_rollup_hourly.key_id = f.key_id
  AND call_rollup_hourly.status = f.status;

UPDATE request_rollup_daily SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT hour / 24 AS day, route, policy, key_id, status, sum(cache_hits) AS hits,
             sum(cached_tokens) AS tokens, sum(cache_saving_usd) AS saving
      FROM request_rollup_hourly WHERE cache_hits <> 0 OR cached_tokens <> 0 OR cache_saving_usd <> 0
      GROUP BY 1, 2, 3, 4, 5) AS f
WHERE request_rollup_daily.day = f.day AND request_rollup_daily.route = f.route
  AND request_rollup_daily.policy = f.policy AND request_rollup_daily.key_id = f.key_id
  AND request_rollup_daily.status = f.status;

UPDATE call_rollup_daily SET cache_hits = f.hits, cached_tokens = f.tokens, cache_saving_usd = f.saving
FROM (SELECT hour / 24 AS day, model, route, policy, key_id, status, sum(cache_hits) AS hits,
             sum(cached_tokens) AS tokens, sum(cache_saving_usd) AS saving
      FROM call_rollup_hourly WHERE cache_hits <> 0 OR cached_tokens <> 0 OR cache_saving_usd <> 0
      GROUP BY 1, 2, 3, 4, 5, 6) AS f
WHERE call_rollup_daily.day = f.day AND call_rollup_daily.model = f.model AND call_rollup_daily.route = f.route
  AND call_rollup_daily.policy = f.policy AND call_rollup_daily.key_id = f.key_id
  AND call_rollup_daily.status = f.status;

-- 002's triggers, with the cache columns
CREATE TRIGGER request_rollup_insert AFTER INSERT ON requests
BEGIN
    INSERT INTO request_rollup_hourly (hour, route, policy, key_id, status, requests, prompt_tokens,
        completion_tokens, context_tokens, cost_usd, counterfactual_cost_usd, latency_ms_sum, latency_count,
        cache_hits, cached_tokens, cache_saving_usd)
    VALUES (CAST(NEW.created_at / 3600 AS INTEGER), coalesce(NEW.route, ''), coalesce(NEW.policy, ''),
        coalesce(NEW.key_id, ''), NEW.status, 1, NEW.prompt_tokens, NEW.completion_tokens, NEW.context_tokens,
        NEW.cost_usd, NEW.counterfactual_cost_usd, coalesce(NEW.latency_ms, 0), NEW.latency_ms IS NOT NULL,
        NEW.cached_tokens > 0, NEW.cached_tokens, NEW.cache_saving_usd)
    ON CONFLICT (hour, route, policy, key_id, status) DO UPDATE SET
        requests = requests + 1,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        context_tokens = context_tokens + excluded.context_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        counterfactual_cost_usd = counterfactual_cost_usd + excluded.counterfactual_cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count,
        cache_hits = cache_hits + excluded.cache_hits,
        cached_tokens = cached_tokens + excluded.cached_tokens,
        cache_saving_usd = cache_saving_usd + excluded.cache_saving_usd;
END;

-- The ledger writes with INSERT OR REPLACE; REPLACE's implicit delete fires no DELETE trigger
-- (recursive_triggers is off), so take the replaced row out of the rollup here.
CREATE TRIGGER request_rollup_replace BEFORE INSERT ON requests
WHEN EXISTS (SELECT 1 FROM requests WHERE id = NEW.id)
BEGIN
    UPDATE request_rollup_hourly SET
        requests = requests - 1,
        prompt_tokens = request_rollup_hourly.prompt_tokens - prev.prompt_tokens,
        completion_tokens = request_rollup_hourly.completion_tokens - prev.completion_tokens,
        context_tokens = request_rollup_hourly.context_tokens - prev.context_tokens,
        cost_usd = request_rollup_hourly.cost_usd - prev.cost_usd,
        counterfactual_cost_usd = request_rollup_hourly.counterfactual_cost_usd - prev.counterfactual_cost_usd,
        latency_ms_sum = latency_ms_sum - coalesce(prev.latency_ms, 0),
        latency_count = latency_count - (prev.latency_ms IS NOT NULL),
        cache_hits = cache_hits - (prev.cached_tokens > 0),
        cached_tokens = request_rollup_hourly.cached_tokens - prev.cached_tokens,
        cache_saving_usd = request_rollup_hourly.cache_saving_usd - prev.cache_saving_usd
    FROM (SELECT * FROM requests WHERE id = NEW.id) AS prev
    WHERE request_rollup_hourly.hour = CAST(prev.created_at / 3600 AS INTEGER)
      AND request_rollup_hourly.route = coalesce(prev.route, '')
      AND request_rollup_hourly.policy = coalesce(prev.policy, '')
      AND request_rollup_hourly.key_id = coalesce(prev.key_id, '')
      AND request_rollup_hourly.status = prev.status;
END;

CREATE TRIGGER request_rollup_delete AFTER DELETE ON requests
BEGIN
    UPDATE request_rollup_hourly SET
        requests = requests - 1,
        prompt_tokens = prompt_tokens - OLD.prompt_tokens,
        completion_tokens = completion_tokens - OLD.completion_tokens,
        context_tokens = context_tokens - OLD.context_tokens,
        cost_usd = cost_usd - OLD.cost_usd,
        counterfactual_cost_usd = counterfactual_cost_usd - OLD.counterfactual_cost_usd,
        latency_ms_sum = latency_ms_sum - coalesce(OLD.latency_ms, 0),
        latency_count = latency_count - (OLD.latency_ms IS NOT NULL),
        cache_hits = cache_hits - (OLD.cached_tokens > 0),
        cached_tokens = cached_tokens - OLD.cached_tokens,
        cache_saving_usd = cache_saving_usd - OLD.cache_saving_usd
    WHERE hour = CAST(OLD.created_at / 3600 AS INTEGER) AND route = coalesce(OLD.route, '')
      AND policy = coalesce(OLD.policy, '') AND key_id = coalesce(OLD.key_id, '') AND status = OLD.status;
END;

CREATE TRIGGER call_rollup_insert AFTER INSERT ON upstream_calls
BEGIN
    INSERT INTO call_rollup_hourly (hour, model, route, policy, key_id, status, calls, errors, prompt_tokens,
        completion_tokens, cost_usd, latency_ms_sum, latency_count, cache_hits, cached_tokens, cache_saving_usd)
    SELECT CAST(r.created_at / 3600 AS INTEGER), NEW.model, coalesce(r.route, ''), coalesce(r.policy, ''),
        coalesce(r.key_id, ''), r.status, 1, NEW.error IS NOT NULL, NEW.prompt_tokens, NEW.completion_tokens,
        NEW.cost_usd, coalesce(NEW.latency_ms, 0), NEW.latency_ms IS NOT NULL, NEW.cached_tokens > 0,
        NEW.cached_tokens, NEW.cache_saving_usd
    FROM requests r WHERE r.id = NEW.request_id
    ON CONFLICT (hour, model, route, policy, key_id, status) DO UPDATE SET
        calls = calls + 1,
        errors = errors + excluded.errors,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count,
        cache_hits = cache_hits + excluded.cache_hits,
        cached_tokens = cached_tokens + excluded.cached_tokens,
        cache_saving_usd = cache_saving_usd + excluded.cache_saving_usd;
END;

CREATE TRIGGER call_rollup_delete AFTER DELETE ON upstream_calls
BEGIN
    UPDATE call_rollup_hourly SET
        calls = calls - 1,
        errors = errors - (OLD.error IS NOT NULL),
        prompt_tokens = prompt_tokens - OLD.prompt_tokens,
        completion_tokens = completion_tokens - OLD.completion_tokens,
        cost_usd = cost_usd - OLD.cost_usd,
        latency_ms_sum = latency_ms_sum - coalesce(OLD.latency_ms, 0),
        latency_count = latency_count - (OLD.latency_ms IS NOT NULL),
        cache_hits = cache_hits - (OLD.cached_tokens > 0),
        cached_tokens = cached_tokens - OLD.cached_tokens,
        cache_saving_usd = cache_saving_usd - OLD.cache_saving_usd
    WHERE (hour, model, route, policy, key_id, status) IN (
        SELECT CAST(r.created_at / 3600 AS INTEGER), OLD.model, coalesce(r.route, ''), coalesce(r.policy, ''),
               coalesce(r.key_id, ''), r.status
        FROM requests r WHERE r.id = OLD.request_id);
END;

-- 003's triggers, with the cache columns
CREATE TRIGGER request_rollup_daily_insert AFTER INSERT ON request_rollup_hourly
BEGIN
    INSERT INTO request_rollup_daily (day, route, policy, key_id, status, requests, prompt_tokens, completion_tokens,
        context_tokens, cost_usd, counterfactual_cost_usd, latency_ms_sum, latency_count, cache_hits, cached_tokens,
        cache_saving_usd)
    VALUES (NEW.hour / 24, NEW.route, NEW.policy, NEW.key_id, NEW.status, NEW.requests, NEW.prompt_tokens,
        NEW.completion_tokens, NEW.context_tokens, NEW.cost_usd, NEW.counterfactual_cost_usd, NEW.latency_ms_sum,
        NEW.latency_count, NEW.cache_hits, NEW.cached_tokens, NEW.cache_saving_usd)
    ON CONFLICT (day, route, policy, key_id, status) DO UPDATE SET
        requests = requests + excluded.requests,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        context_tokens = context_tokens + excluded.context_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        counterfactual_cost_usd = counterfactual_cost_usd + excluded.counterfactual_cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count,
        cache_hits = cache_hits + excluded.cache_hits,
        cached_tokens = cached_tokens + excluded.cached_tokens,
        cache_saving_usd = cache_saving_usd + excluded.cache_saving_usd;
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
        latency_count = latency_count + NEW.latency_count - OLD.latency_count,
        cache_hits = cache_hits + NEW.cache_hits - OLD.cache_hits,
        cached_tokens = cached_tokens + NEW.cached_tokens - OLD.cached_tokens,
        cache_saving_usd = cache_saving_usd + NEW.cache_saving_usd - OLD.cache_saving_usd
    WHERE day = NEW.hour / 24 AND route = NEW.route AND policy = NEW.policy AND key_id = NEW.key_id
      AND status = NEW.status;
END;

CREATE TRIGGER call_rollup_daily_insert AFTER INSERT ON call_rollup_hourly
BEGIN
    INSERT INTO call_rollup_daily (day, model, route, policy, key_id, status, calls, errors, prompt_tokens,
        completion_tokens, cost_usd, latency_ms_sum, latency_count, cache_hits, cached_tokens, cache_saving_usd)
    VALUES (NEW.hour / 24, NEW.model, NEW.route, NEW.policy, NEW.key_id, NEW.status, NEW.calls, NEW.errors,
        NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd, NEW.latency_ms_sum, NEW.latency_count,
        NEW.cache_hits, NEW.cached_tokens, NEW.cache_saving_usd)
    ON CONFLICT (day, model, route, policy, key_id, status) DO UPDATE SET
        calls = calls + excluded.calls,
        errors = errors + excluded.errors,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count,
        cache_hits = cache_hits + excluded.cache_hits,
        cached_tokens = cached_tokens + excluded.cached_tokens,
        cache_saving_usd = cache_saving_usd + excluded.cache_saving_usd;
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
        latency_count = latency_count + NEW.latency_count - OLD.latency_count,
        cache_hits = cache_hits + NEW.cache_hits - OLD.cache_hits,
        cached_tokens = cached_tokens + NEW.cached_tokens - OLD.cached_tokens,
        cache_saving_usd = cache_saving_usd + NEW.cache_saving_usd - OLD.cache_saving_usd
    WHERE day = NEW.hour / 24 AND model = NEW.model AND route = NEW.route AND policy = NEW.policy
      AND key_id = NEW.key_id AND status = NEW.status;
END;

-- 005's partial indexes served the raw-row sums the rollups replace (dropped after the backfill, which used them)
DROP INDEX requests_cached_created_at;
DROP INDEX upstream_calls_cached_request_id;
