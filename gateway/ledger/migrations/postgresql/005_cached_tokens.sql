-- PostgreSQL twin of sqlite/005_cached_tokens.sql: provider prompt caching per request and per leg.
-- cached_tokens: prompt tokens served from the upstream's cache (a subset of prompt_tokens);
-- cache_saving_usd: the cost at the uncached input price minus the cost charged (negative for cache writes).
ALTER TABLE requests ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE upstream_calls ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE upstream_calls ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;
