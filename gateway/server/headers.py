"""HTTP header names the gateway reads or writes: spelled once here."""

from __future__ import annotations

REQUEST_ID = "x-selfroute-request-id"  # on every response: the gateway's own id of the request (the ledger's key)
# on every response: the client's X-Request-Id when it sent a valid one, else the gateway's id (what the openai SDK
# reads as `_request_id`); also read from the request
CLIENT_REQUEST_ID = "x-request-id"
ROUTE = "x-selfroute-route"  # routed answers: direct | rag | long | rag>long
REASON = "x-selfroute-reason"  # why that route
FLAGS = "x-selfroute-flags"  # routed answers and ingest reports whose documents a security check flagged
GROUNDING = "x-selfroute-grounding"  # routed answers with the grounding check on: unsupported=N/checked sentences
COLLECTION = "x-selfroute-collection"  # a request's collection, instead of extra_body selfroute.collection
FALLBACK_ERROR = "x-selfroute-fallback-error"  # the long route failed; the cheap answer was sent: "<status> <code>"
COST = "x-selfroute-cost-usd"  # whole answers: what the request cost, every leg together (USD)
# keyed requests, as OpenAI sends them: the key's limits, what is left in the current window, and when it resets
RATELIMIT_LIMIT_REQUESTS = "x-ratelimit-limit-requests"
RATELIMIT_REMAINING_REQUESTS = "x-ratelimit-remaining-requests"
RATELIMIT_RESET_REQUESTS = "x-ratelimit-reset-requests"
RATELIMIT_LIMIT_TOKENS = "x-ratelimit-limit-tokens"
RATELIMIT_REMAINING_TOKENS = "x-ratelimit-remaining-tokens"
RATELIMIT_RESET_TOKENS = "x-ratelimit-reset-tokens"
