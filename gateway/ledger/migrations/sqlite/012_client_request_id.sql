-- The client's own X-Request-Id (when it sent a valid one), so a request can be found by the id the client logged.
-- Not the primary key: clients reuse ids (retries), and a reused id must never replace another request's row.
-- The partial index holds only the requests that carried one.
ALTER TABLE requests ADD COLUMN client_request_id TEXT;
CREATE INDEX requests_client_request_id ON requests (client_request_id) WHERE client_request_id IS NOT NULL;
