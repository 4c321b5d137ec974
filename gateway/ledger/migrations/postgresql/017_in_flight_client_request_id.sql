-- PostgreSQL twin of sqlite/017_in_flight_client_request_id.sql.
ALTER TABLE requests_in_flight ADD COLUMN client_request_id text;
