-- Provider prompt caching: prompt tokens the upstream served from its cache (OpenAI
-- prompt_tokens_details.cached_tokens, Anthropic cache_read_input_tokens), a subset of prompt_tokens, and what
-- caching changed in cost: the cost at the uncached input price minus the cost charged (cache reads are cheaper;
-- Anthropic's cache writes dearer, so it can be negative). Reports sum them from the raw rows.
-- (004 is the key store.)
ALTER TABLE requests ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN cache_saving_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE upstream_calls ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE upstream_calls ADD COLUMN cache_saving_usd REAL NOT NULL DEFAULT 0;
-- Reports sum the cache figures from the raw rows; these partial indexes hold only the rows caching touched, so
-- that costs nothing on a ledger where few requests hit a cache.
CREATE INDEX requests_cached_created_at ON requests (created_at) WHERE cached_tokens <> 0 OR cache_saving_usd <> 0;
CREATE INDEX upstream_calls_cached_request_id ON upstream_calls (request_id)
    WHERE cached_tokens <> 0 OR cache_saving_usd <> 0;
