"""HTTP header names the gateway reads or writes: spelled once here."""
from __future__ import annotations

REQUEST_ID = "x-selfroute-request-id"  # on every response
ROUTE = "x-selfroute-route"  # routed answers: direct | rag | long | rag>long
REASON = "x-selfroute-reason"  # why that route
FLAGS = "x-selfroute-flags"  # routed answers and ingest reports whose documents a security check flagged
GROUNDING = "x-selfroute-grounding"  # routed answers with the grounding check on: unsupported=N/checked sentences
COLLECTION = "x-selfroute-collection"  # a request's collection, instead of extra_body selfroute.collection
FALLBACK_ERROR = "x-selfroute-fallback-error"  # the long route failed; the cheap answer was sent: "<status> <code>"
