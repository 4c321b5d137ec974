"""What tests share, in one place (test modules import helpers only from here, never from each other):
policies (the policy builders), gateway (a gateway on a real server, its ledger rows), servers (uvicorn on port 0,
`selfroute serve` processes), fake_upstream, capture (a server that records what reaches it), engines (PostgreSQL,
moto's S3), routed (the routed-gateway tests' documents, question, toy verifier, clock), and the data builders of
ledger, pipelines, classifier, routing (paired answers) and evaluation tests. Fixtures live in the conftest.py of
the directories whose tests use them."""
