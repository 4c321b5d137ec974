-- PostgreSQL twin of sqlite/009_key_admin_periods.sql: the stored admin key, budget periods, rotation time.
ALTER TABLE api_keys ADD COLUMN admin integer NOT NULL DEFAULT 0;  -- an integer, as in SQLite
ALTER TABLE api_keys ADD COLUMN budget_period_s double precision;
ALTER TABLE api_keys ADD COLUMN period_anchor double precision;
ALTER TABLE api_keys ADD COLUMN rotated_at double precision;
