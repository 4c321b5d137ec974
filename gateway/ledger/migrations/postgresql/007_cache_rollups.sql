-- PostgreSQL twin of sqlite/007_cache_rollups.sql: provider prompt caching per hour and request route, for the
-- dashboard's cache panel. Only legs that caching touched are added; like 002, plain UPDATEs of legs or of their
-- request (hour or route) keep it right too.
CREATE TABLE cache_rollup_hourly (
    hour bigint NOT NULL,                    -- the request's hour: floor(created_at / 3600)
    route text NOT NULL,                     -- the request's route
    cache_hits bigint NOT NULL DEFAULT 0,            -- legs that read prompt tokens from the provider's cache
    cached_tokens bigint NOT NULL DEFAULT 0,         -- prompt tokens read from it
    cache_saving_usd double precision NOT NULL DEFAULT 0, -- uncached cost less the cost charged (writes: negative)
    PRIMARY KEY (hour, route)
);

INSERT INTO cache_rollup_hourly
SELECT floor(r.created_at / 3600)::bigint, coalesce(r.route, ''), count(CASE WHEN c.cached_tokens > 0 THEN 1 END),
       sum(c.cached_tokens), sum(c.cache_saving_usd)
FROM upstream_calls c JOIN requests r ON r.id = c.request_id
WHERE c.cached_tokens <> 0 OR c.cache_saving_usd <> 0 GROUP BY 1, 2;

-- Add one leg that caching touched to the hourly group of its request r.
CREATE FUNCTION cache_rollup_add(c upstream_calls, r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cache_rollup_hourly AS h (hour, route, cache_hits, cached_tokens, cache_saving_usd)
    VALUES (floor(r.created_at / 3600)::bigint, coalesce(r.route, ''), (c.cached_tokens > 0)::int, c.cached_tokens,
        c.cache_saving_usd)
    ON CONFLICT (hour, route) DO UPDATE SET
        cache_hits = h.cache_hits + excluded.cache_hits,
        cached_tokens = h.cached_tokens + excluded.cached_tokens,
        cache_saving_usd = h.cache_saving_usd + excluded.cache_saving_usd;
END $$;

CREATE FUNCTION cache_rollup_sub(c upstream_calls, r requests) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cache_rollup_hourly AS h SET
        cache_hits = h.cache_hits - (c.cached_tokens > 0)::int,
        cached_tokens = h.cached_tokens - c.cached_tokens,
        cache_saving_usd = h.cache_saving_usd - c.cache_saving_usd
    WHERE h.hour = floor(r.created_at / 3600)::bigint AND h.route = coalesce(r.route, '');
END $$;

CREATE FUNCTION cache_rollup_call_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r requests;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (OLD.cached_tokens <> 0 OR OLD.cache_saving_usd <> 0) THEN
        SELECT * INTO r FROM requests WHERE id = OLD.request_id;
        IF FOUND THEN
            PERFORM cache_rollup_sub(OLD, r);
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND (NEW.cached_tokens <> 0 OR NEW.cache_saving_usd <> 0) THEN
        SELECT * INTO r FROM requests WHERE id = NEW.request_id;
        IF FOUND THEN
            PERFORM cache_rollup_add(NEW, r);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER cache_rollup_insert AFTER INSERT ON upstream_calls
    FOR EACH ROW WHEN (NEW.cached_tokens <> 0 OR NEW.cache_saving_usd <> 0)
    EXECUTE FUNCTION cache_rollup_call_trigger();
CREATE TRIGGER cache_rollup_update AFTER UPDATE ON upstream_calls
    FOR EACH ROW WHEN (OLD.cached_tokens <> 0 OR OLD.cache_saving_usd <> 0
                       OR NEW.cached_tokens <> 0 OR NEW.cache_saving_usd <> 0)
    EXECUTE FUNCTION cache_rollup_call_trigger();
CREATE TRIGGER cache_rollup_delete AFTER DELETE ON upstream_calls
    FOR EACH ROW WHEN (OLD.cached_tokens <> 0 OR OLD.cache_saving_usd <> 0)
    EXECUTE FUNCTION cache_rollup_call_trigger();

-- A request whose hour or route changes takes its cached legs along (the writer deletes and re-inserts a
-- re-written request's legs, so this only runs for ad-hoc UPDATEs).
CREATE FUNCTION cache_rollup_request_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c upstream_calls;
BEGIN
    FOR c IN SELECT * FROM upstream_calls WHERE request_id = NEW.id
             AND (cached_tokens <> 0 OR cache_saving_usd <> 0) ORDER BY id LOOP
        PERFORM cache_rollup_sub(c, OLD);
        PERFORM cache_rollup_add(c, NEW);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER cache_rollup_move AFTER UPDATE ON requests
    FOR EACH ROW WHEN (floor(OLD.created_at / 3600) IS DISTINCT FROM floor(NEW.created_at / 3600)
                       OR OLD.route IS DISTINCT FROM NEW.route)
    EXECUTE FUNCTION cache_rollup_request_trigger();
