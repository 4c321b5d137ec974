-- PostgreSQL twin of sqlite/014_policy_reloads.sql: the policy reload's generations, and what each serving process
-- (of every replica sharing this database) has in force.
CREATE TABLE policy_reloads (
    generation bigserial PRIMARY KEY,
    requested_at double precision NOT NULL,
    requested_by text NOT NULL,
    policy_sha256 text
);

CREATE TABLE gateway_processes (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    generation bigint NOT NULL,
    state text NOT NULL
);
