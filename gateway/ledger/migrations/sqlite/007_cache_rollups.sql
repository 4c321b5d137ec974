-- Provider prompt caching per hour and route, so the dashboard's cache panel reads one row per (hour, route)
-- instead of every cached leg of the window (most long-route legs, on a busy gateway that caches well).
-- Keyed like the call rollups (002): the request's hour and route, '' for a NULL route. Only legs that caching
-- touched (cached_tokens or cache_saving_usd non-zero, as migration 005's partial index) have a row to add to;
-- the window's calls and prompt tokens, the denominators, come from call_rollup_hourly/daily.
CREATE TABLE cache_rollup_hourly (
    hour INTEGER NOT NULL,               -- the request's hour: CAST(created_at / 3600 AS INTEGER)
    route TEXT NOT NULL,                 -- the request's route
    cache_hits INTEGER NOT NULL DEFAULT 0,       -- legs that read prompt tokens from the provider's cache
    cached_tokens INTEGER NOT NULL DEFAULT 0,    -- prompt tokens read from it
    cache_saving_usd REAL NOT NULL DEFAULT 0,    -- uncached cost less the cost charged (cache writes: negative)
    PRIMARY KEY (hour, route)
) WITHOUT ROWID;

INSERT INTO cache_rollup_hourly
SELECT CAST(r.created_at / 3600 AS INTEGER), coalesce(r.route, ''), count(CASE WHEN c.cached_tokens > 0 THEN 1 END),
       sum(c.cached_tokens), sum(c.cache_saving_usd)
FROM upstream_calls c JOIN requests r ON r.id = c.request_id
WHERE c.cached_tokens <> 0 OR c.cache_saving_usd <> 0 GROUP BY 1, 2;

-- The writer deletes a re-written request's legs before it replaces the request and inserts the new legs, so
-- a leg is always added and taken out under the dimensions of the request it belongs to.
CREATE TRIGGER cache_rollup_insert AFTER INSERT ON upstream_calls
WHEN NEW.cached_tokens <> 0 OR NEW.cache_saving_usd <> 0
BEGIN
    INSERT INTO cache_rollup_hourly (hour, route, cache_hits, cached_tokens, cache_saving_usd)
    SELECT CAST(r.created_at / 3600 AS INTEGER), coalesce(r.route, ''), NEW.cached_tokens > 0, NEW.cached_tokens,
        NEW.cache_saving_usd
    FROM requests r WHERE r.id = NEW.request_id
    ON CONFLICT (hour, route) DO UPDATE SET
        cache_hits = cache_hits + excluded.cache_hits,
        cached_tokens = cached_tokens + excluded.cached_tokens,
        cache_saving_usd = cache_saving_usd + excluded.cache_saving_usd;
END;

CREATE TRIGGER cache_rollup_delete AFTER DELETE ON upstream_calls
WHEN OLD.cached_tokens <> 0 OR OLD.cache_saving_usd <> 0
BEGIN
    UPDATE cache_rollup_hourly SET
        cache_hits = cache_hits - (OLD.cached_tokens > 0),
        cached_tokens = cached_tokens - OLD.cached_tokens,
        cache_saving_usd = cache_saving_usd - OLD.cache_saving_usd
    WHERE (hour, route) IN (
        SELECT CAST(r.created_at / 3600 AS INTEGER), coalesce(r.route, '') FROM requests r WHERE r.id = OLD.request_id);
END;
