"""What tests share, in one place (test modules import helpers only from here, never from each other):
policies (the test policy builder), gateway (a gateway on a real server, its ledger rows), servers (uvicorn on
port 0, `selfroute serve` processes), fake_upstream, capture (a server that records what reaches it), engines
(PostgreSQL, moto's S3), and the data builders of ledger, pipelines, classifier and routing tests."""
