"""Route names: the one place they are spelled. Policies, routing, the ledger, metrics and the replay import them.

A policy chooses among the three routes of `Route`. What the ledger records for a request is one of those,
or `PASSTHROUGH` (a model name that is not a routed alias) or `FALLBACK` (the cheap route answered first, its
answer was not trusted, and the long route answered again); `SHADOW` and `JUDGE` are the learning loop's own
requests (labels for the router, never an answer to a client).
"""

from __future__ import annotations

from enum import StrEnum


class Route(StrEnum):
    DIRECT = "direct"  # the whole context to the cheap model (it fits the cheap model's window)
    RAG = "rag"  # retrieved passages to the cheap model
    LONG = "long"  # whole documents (or packed sections) to the long-context model


DIRECT, RAG, LONG = Route.DIRECT.value, Route.RAG.value, Route.LONG.value
PASSTHROUGH = "passthrough"
FALLBACK = "rag>long"
# learning legs (gateway.routing.learning): the long route run in the background on an accepted cheap answer, and
# the judge comparing a cheap answer with a long one. Each is its own ledgered request, never the client's answer.
SHADOW = "shadow"
JUDGE = "judge"
LEARNING_ROUTES = (SHADOW, JUDGE)
# the replay's name for a cheap refusal that the policy let stand (the live ledger records it as RAG)
KEPT_REFUSAL = "kept-refusal"


def answered_by(route: str) -> tuple[str, ...]:
    """The recorded routes whose answer `route`'s model gave: the long route answers `long` and the escalations
    (`rag>long`, a cheap answer not trusted); any other route only itself."""
    return (LONG, FALLBACK) if route == LONG else (route,)
