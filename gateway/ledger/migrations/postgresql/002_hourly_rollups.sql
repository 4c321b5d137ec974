-- PostgreSQL twin of sqlite/002_hourly_rollups.sql.
-- Hourly rollups, so cost reports read one row per (hour, group) instead of every request.
-- Triggers keep them in step with the raw tables inside the writer's transaction.
-- Text key columns hold '' for NULL, as in SQLite. Hours are UTC: floor(created_at / 3600).
--
-- SQLite has no UPSERT on the raw rows: its writer uses INSERT OR REPLACE and a BEFORE INSERT trigger takes
-- the replaced row out. PostgreSQL has no REPLACE; a writer here re-writes a request either with
-- INSERT ... ON CONFLICT (id) DO UPDATE (an UPDATE: the update trigger takes OLD out and puts NEW in) or with
-- DELETE + INSERT (the delete and insert triggers). Either way the rollups end as SQLite's do, with the same
-- floating-point operations in the same order (subtract the old row, then add the new one).
-- Beyond SQLite: a plain UPDATE of requests or upstream_calls keeps the rollups right too (SQLite has no
-- UPDATE triggers), including moving a request's legs when its hour/route/policy/key/status change.
-- Like SQLite, groups that drop to zero keep their (all-zero) row.
CREATE TABLE request_rollup_hourly (
    hour bigint NOT NULL,
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
    PRIMARY KEY (hour, route, policy, key_id, status)
);

-- Legs, keyed by their model and by the dimensions of the request they belong to (for filters).
CREATE TABLE call_rollup_hourly (
    hour bigint NOT NULL,                    -- the request's hour, so time filters agree with requests
    model text NOT NULL,
    route text NOT NULL,                     -- the request's route
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
    PRIMARY KEY (hour, model, route, policy, key_id, status)
);

INSERT INTO request_rollup_hourly
SELECT floor(created_at / 3600)::bigint, coalesce(route, ''), coalesce(policy, ''), coalesce(key_id, ''), status,
       count(*), sum(prompt_tokens), sum(completion_tokens), sum(context_tokens), sum(cost_usd),
       sum(counterfactual_cost_usd), coalesce(sum(latency_ms), 0), count(latency_ms)
FROM requests GROUP BY 1, 2, 3, 4, 5;

INSERT INTO call_rollup_hourly
SELECT floor(r.created_at / 3600)::bigint, c.model, coalesce(r.route, ''), coalesce(r.policy, ''),
       coalesce(r.key_id, ''), r.status, count(*), count(c.error), sum(c.prompt_tokens), sum(c.completion_tokens),
       sum(c.cost_usd), coalesce(sum(c.latency_ms), 0), count(c.latency_ms)
FROM upstream_calls c JOIN requests r ON r.id = c.request_id GROUP BY 1, 2, 3, 4, 5, 6;

-- Add one request to its hourly group (insert or bump the row).
CREATE FUNCTION request_rollup_add(r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO request_rollup_hourly AS h (hour, route, policy, key_id, status, requests, prompt_tokens,
        completion_tokens, context_tokens, cost_usd, counterfactual_cost_usd, latency_ms_sum, latency_count)
    VALUES (floor(r.created_at / 3600)::bigint, coalesce(r.route, ''), coalesce(r.policy, ''),
        coalesce(r.key_id, ''), r.status, 1, r.prompt_tokens, r.completion_tokens, r.context_tokens,
        r.cost_usd, r.counterfactual_cost_usd, coalesce(r.latency_ms, 0), (r.latency_ms IS NOT NULL)::int)
    ON CONFLICT (hour, route, policy, key_id, status) DO UPDATE SET
        requests = h.requests + 1,
        prompt_tokens = h.prompt_tokens + excluded.prompt_tokens,
        completion_tokens = h.completion_tokens + excluded.completion_tokens,
        context_tokens = h.context_tokens + excluded.context_tokens,
        cost_usd = h.cost_usd + excluded.cost_usd,
        counterfactual_cost_usd = h.counterfactual_cost_usd + excluded.counterfactual_cost_usd,
        latency_ms_sum = h.latency_ms_sum + excluded.latency_ms_sum,
        latency_count = h.latency_count + excluded.latency_count;
END $$;

-- Take one request out of its hourly group (the row stays, possibly all zeros, as in SQLite).
CREATE FUNCTION request_rollup_sub(r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE request_rollup_hourly AS h SET
        requests = h.requests - 1,
        prompt_tokens = h.prompt_tokens - r.prompt_tokens,
        completion_tokens = h.completion_tokens - r.completion_tokens,
        context_tokens = h.context_tokens - r.context_tokens,
        cost_usd = h.cost_usd - r.cost_usd,
        counterfactual_cost_usd = h.counterfactual_cost_usd - r.counterfactual_cost_usd,
        latency_ms_sum = h.latency_ms_sum - coalesce(r.latency_ms, 0),
        latency_count = h.latency_count - (r.latency_ms IS NOT NULL)::int
    WHERE h.hour = floor(r.created_at / 3600)::bigint AND h.route = coalesce(r.route, '')
      AND h.policy = coalesce(r.policy, '') AND h.key_id = coalesce(r.key_id, '') AND h.status = r.status;
END $$;

-- Add one leg to the hourly group of the request r it belongs to.
CREATE FUNCTION call_rollup_add(c upstream_calls, r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO call_rollup_hourly AS h (hour, model, route, policy, key_id, status, calls, errors, prompt_tokens,
        completion_tokens, cost_usd, latency_ms_sum, latency_count)
    VALUES (floor(r.created_at / 3600)::bigint, c.model, coalesce(r.route, ''), coalesce(r.policy, ''),
        coalesce(r.key_id, ''), r.status, 1, (c.error IS NOT NULL)::int, c.prompt_tokens, c.completion_tokens,
        c.cost_usd, coalesce(c.latency_ms, 0), (c.latency_ms IS NOT NULL)::int)
    ON CONFLICT (hour, model, route, policy, key_id, status) DO UPDATE SET
        calls = h.calls + 1,
        errors = h.errors + excluded.errors,
        prompt_tokens = h.prompt_tokens + excluded.prompt_tokens,
        completion_tokens = h.completion_tokens + excluded.completion_tokens,
        cost_usd = h.cost_usd + excluded.cost_usd,
        latency_ms_sum = h.latency_ms_sum + excluded.latency_ms_sum,
        latency_count = h.latency_count + excluded.latency_count;
END $$;

CREATE FUNCTION call_rollup_sub(c upstream_calls, r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE call_rollup_hourly AS h SET
        calls = h.calls - 1,
        errors = h.errors - (c.error IS NOT NULL)::int,
        prompt_tokens = h.prompt_tokens - c.prompt_tokens,
        completion_tokens = h.completion_tokens - c.completion_tokens,
        cost_usd = h.cost_usd - c.cost_usd,
        latency_ms_sum = h.latency_ms_sum - coalesce(c.latency_ms, 0),
        latency_count = h.latency_count - (c.latency_ms IS NOT NULL)::int
    WHERE h.hour = floor(r.created_at / 3600)::bigint AND h.model = c.model AND h.route = coalesce(r.route, '')
      AND h.policy = coalesce(r.policy, '') AND h.key_id = coalesce(r.key_id, '') AND h.status = r.status;
END $$;

CREATE FUNCTION request_rollup_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c upstream_calls;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM request_rollup_sub(OLD);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM request_rollup_add(NEW);
    END IF;
    IF TG_OP = 'UPDATE' THEN
        -- legs are keyed by their request's dimensions: move them if those changed (the writer deletes and
        -- re-inserts a re-written request's legs, so this only runs for ad-hoc UPDATEs)
        IF floor(OLD.created_at / 3600) IS DISTINCT FROM floor(NEW.created_at / 3600)
           OR OLD.route IS DISTINCT FROM NEW.route OR OLD.policy IS DISTINCT FROM NEW.policy
           OR OLD.key_id IS DISTINCT FROM NEW.key_id OR OLD.status IS DISTINCT FROM NEW.status THEN
            FOR c IN SELECT * FROM upstream_calls WHERE request_id = NEW.id ORDER BY id LOOP
                PERFORM call_rollup_sub(c, OLD);
                PERFORM call_rollup_add(c, NEW);
            END LOOP;
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER request_rollup_insert AFTER INSERT ON requests
    FOR EACH ROW EXECUTE FUNCTION request_rollup_trigger();
-- INSERT ... ON CONFLICT (id) DO UPDATE fires this one (not the insert trigger) for a re-written request
CREATE TRIGGER request_rollup_update AFTER UPDATE ON requests
    FOR EACH ROW EXECUTE FUNCTION request_rollup_trigger();
-- Explicit deletes (pruning old rows, or delete + insert re-writes) leave the rollup consistent too.
CREATE TRIGGER request_rollup_delete AFTER DELETE ON requests
    FOR EACH ROW EXECUTE FUNCTION request_rollup_trigger();

CREATE FUNCTION call_rollup_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r requests;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        SELECT * INTO r FROM requests WHERE id = OLD.request_id;
        IF FOUND THEN
            PERFORM call_rollup_sub(OLD, r);
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        SELECT * INTO r FROM requests WHERE id = NEW.request_id;
        IF FOUND THEN
            PERFORM call_rollup_add(NEW, r);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER call_rollup_insert AFTER INSERT ON upstream_calls
    FOR EACH ROW EXECUTE FUNCTION call_rollup_trigger();
CREATE TRIGGER call_rollup_update AFTER UPDATE ON upstream_calls
    FOR EACH ROW EXECUTE FUNCTION call_rollup_trigger();
CREATE TRIGGER call_rollup_delete AFTER DELETE ON upstream_calls
    FOR EACH ROW EXECUTE FUNCTION call_rollup_trigger();
