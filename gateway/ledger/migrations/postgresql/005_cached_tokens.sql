-- PostgreSQL twin of sqlite/005_cached_tokens.sql: provider prompt caching per request and per leg.
-- cached_tokens: prompt tokens served from the upstream's cache (a subset of prompt_tokens);
-- cache_saving_usd: the cost at the uncached input price minus the cost charged (negative for cache writes).
ALTER TABLE requests ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE upstream_calls ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE upstream_calls ADD COLUMN cache_saving_usd double precision NOT NULL DEFAULT 0;
-- Reports sum the cache figures from the raw rows; these partial indexes hold only the rows caching touched, so
-- that costs nothing on a ledger where few requests hit a cache.
CREATE INDEX requests_cached_created_at ON requests (created_at) WHERE cached_tokens <> 0 OR cache_saving_usd <> 0;
CREATE INDEX upstream_calls_cached_request_id ON upstream_calls (request_id)
    WHERE cached_tokens <> 0 OR cache_saving_usd <> 0;
