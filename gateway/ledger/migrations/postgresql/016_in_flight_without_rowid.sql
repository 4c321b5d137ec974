-- PostgreSQL twin of sqlite/016_in_flight_without_rowid.sql: the index on expires_at, which no query used, dropped
-- (a heap table has no rowid to drop).
DROP INDEX IF EXISTS requests_in_flight_expires;
