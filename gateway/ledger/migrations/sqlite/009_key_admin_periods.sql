-- The admin key kept hashed like every named key (created by `selfroute keys create --admin`), budgets that
-- count spend per period (`--budget-period 30d`), and when a key was last rotated.
ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;  -- 1: accepted on the admin endpoints, no limits
ALTER TABLE api_keys ADD COLUMN budget_period_s REAL;               -- NULL: the budget is for the key's whole life
ALTER TABLE api_keys ADD COLUMN period_anchor REAL;                 -- periods start here, every budget_period_s
ALTER TABLE api_keys ADD COLUMN rotated_at REAL;
