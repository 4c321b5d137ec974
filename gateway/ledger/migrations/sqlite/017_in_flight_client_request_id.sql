-- The client's X-Request-Id on the in-flight row too, so a request settled from it (its process killed, or a
-- shutdown with the database hung) can still be found by the id the client logged (probe11: 14 such rows had none).
ALTER TABLE requests_in_flight ADD COLUMN client_request_id TEXT;
