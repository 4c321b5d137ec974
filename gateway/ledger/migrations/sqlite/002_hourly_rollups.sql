-- Hourly rollups, so cost reports read one row per (hour, group) instead of every request.
-- Triggers keep them in step with the raw tables inside the writer's transaction.
-- Text key columns hold '' for NULL: primary-key columns of a WITHOUT ROWID table cannot be NULL.
-- Hours are UTC: CAST(created_at / 3600 AS INTEGER).
CREATE TABLE request_rollup_hourly (
    hour INTEGER NOT NULL,
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
    PRIMARY KEY (hour, route, policy, key_id, status)
) WITHOUT ROWID;

-- Legs, keyed by their model and by the dimensions of the request they belong to (for filters).
CREATE TABLE call_rollup_hourly (
    hour INTEGER NOT NULL,               -- the request's hour, so time filters agree with requests
    model TEXT NOT NULL,
    route TEXT NOT NULL,                 -- the request's route
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
    PRIMARY KEY (hour, model, route, policy, key_id, status)
) WITHOUT ROWID;

INSERT INTO request_rollup_hourly
SELECT CAST(created_at / 3600 AS INTEGER), coalesce(route, ''), coalesce(policy, ''), coalesce(key_id, ''), status,
       count(*), sum(prompt_tokens), sum(completion_tokens), sum(context_tokens), sum(cost_usd),
       sum(counterfactual_cost_usd), total(latency_ms), count(latency_ms)
FROM requests GROUP BY 1, 2, 3, 4, 5;

INSERT INTO call_rollup_hourly
SELECT CAST(r.created_at / 3600 AS INTEGER), c.model, coalesce(r.route, ''), coalesce(r.policy, ''),
       coalesce(r.key_id, ''), r.status, count(*), count(c.error), sum(c.prompt_tokens), sum(c.completion_tokens),
       sum(c.cost_usd), total(c.latency_ms), count(c.latency_ms)
FROM upstream_calls c JOIN requests r ON r.id = c.request_id GROUP BY 1, 2, 3, 4, 5, 6;

CREATE TRIGGER request_rollup_insert AFTER INSERT ON requests
BEGIN
    INSERT INTO request_rollup_hourly (hour, route, policy, key_id, status, requests, prompt_tokens,
        completion_tokens, context_tokens, cost_usd, counterfactual_cost_usd, latency_ms_sum, latency_count)
    VALUES (CAST(NEW.created_at / 3600 AS INTEGER), coalesce(NEW.route, ''), coalesce(NEW.policy, ''),
        coalesce(NEW.key_id, ''), NEW.status, 1, NEW.prompt_tokens, NEW.completion_tokens, NEW.context_tokens,
        NEW.cost_usd, NEW.counterfactual_cost_usd, coalesce(NEW.latency_ms, 0), NEW.latency_ms IS NOT NULL)
    ON CONFLICT (hour, route, policy, key_id, status) DO UPDATE SET
        requests = requests + 1,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        context_tokens = context_tokens + excluded.context_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        counterfactual_cost_usd = counterfactual_cost_usd + excluded.counterfactual_cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count;
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
        latency_count = latency_count - (prev.latency_ms IS NOT NULL)
    FROM (SELECT * FROM requests WHERE id = NEW.id) AS prev
    WHERE request_rollup_hourly.hour = CAST(prev.created_at / 3600 AS INTEGER)
      AND request_rollup_hourly.route = coalesce(prev.route, '')
      AND request_rollup_hourly.policy = coalesce(prev.policy, '')
      AND request_rollup_hourly.key_id = coalesce(prev.key_id, '')
      AND request_rollup_hourly.status = prev.status;
END;

-- Explicit deletes (pruning old rows) leave the rollup consistent too.
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
        latency_count = latency_count - (OLD.latency_ms IS NOT NULL)
    WHERE hour = CAST(OLD.created_at / 3600 AS INTEGER) AND route = coalesce(OLD.route, '')
      AND policy = coalesce(OLD.policy, '') AND key_id = coalesce(OLD.key_id, '') AND status = OLD.status;
END;

CREATE TRIGGER call_rollup_insert AFTER INSERT ON upstream_calls
BEGIN
    INSERT INTO call_rollup_hourly (hour, model, route, policy, key_id, status, calls, errors, prompt_tokens,
        completion_tokens, cost_usd, latency_ms_sum, latency_count)
    SELECT CAST(r.created_at / 3600 AS INTEGER), NEW.model, coalesce(r.route, ''), coalesce(r.policy, ''),
        coalesce(r.key_id, ''), r.status, 1, NEW.error IS NOT NULL, NEW.prompt_tokens, NEW.completion_tokens,
        NEW.cost_usd, coalesce(NEW.latency_ms, 0), NEW.latency_ms IS NOT NULL
    FROM requests r WHERE r.id = NEW.request_id
    ON CONFLICT (hour, model, route, policy, key_id, status) DO UPDATE SET
        calls = calls + 1,
        errors = errors + excluded.errors,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,
        latency_count = latency_count + excluded.latency_count;
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
        latency_count = latency_count - (OLD.latency_ms IS NOT NULL)
    WHERE (hour, model, route, policy, key_id, status) IN (
        SELECT CAST(r.created_at / 3600 AS INTEGER), OLD.model, coalesce(r.route, ''), coalesce(r.policy, ''),
               coalesce(r.key_id, ''), r.status
        FROM requests r WHERE r.id = OLD.request_id);
END;
