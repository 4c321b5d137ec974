"""POST /v1/feedback: a client's own judgement of an answer it got, kept as a label for the router.

{"request_id": "req_...", "good": true} or {"request_id": "req_...", "score": 0.8} (0..1; good is score >= 0.5).
A key labels only its own requests: another key's request, like an unknown one, is a 404 request_not_found (the
answer does not tell the two apart). The admin key may label any request; a gateway without keys has one tenant.
"""

from __future__ import annotations

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.ledger.records import LABEL_FEEDBACK, LabelRecord
from gateway.protocol import parse_json_object
from gateway.server.bodies import json_response
from gateway.server.context import RequestContext, keyed

MAX_FEEDBACK_BODY = 16 * 1024
GOOD_SCORE = 0.5  # a graded score at or above this counts as a good answer


class FeedbackRequest(BaseModel):
    # strict: "yes", 1 or "0.5" is not a judgement the client meant to send (lax parsing took "yes" for true)
    model_config = ConfigDict(extra="forbid", strict=True)
    request_id: str = Field(min_length=1, max_length=128)
    good: bool | None = None
    score: float | None = Field(None, ge=0.0, le=1.0)

    @field_validator("request_id")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:  # no request has one, and PostgreSQL refuses the lookup itself (was a 500)
            raise ValueError("a request id holds no NUL character")
        return value

    @model_validator(mode="after")
    def _one_judgement(self) -> FeedbackRequest:
        if (self.good is None) == (self.score is None):
            raise ValueError("give exactly one of good (true/false) or score (0..1)")
        return self


def _not_found(request_id: str) -> GatewayError:
    return GatewayError(404, f"no request {request_id!r} of this key", param="request_id", code="request_not_found")


async def feedback(ctx: RequestContext) -> Response:
    """Authenticated and read by `keyed`; not ledgered: it does no model work and spends nothing. Each call counts
    against the key's requests per minute, and a request keeps only its latest label (LabelStore.add), so a key
    cannot grow the ledger faster than its limits let it send requests."""
    gateway, caller = ctx.gateway, ctx.caller
    body = parse_json_object(ctx.body)
    try:
        spec = FeedbackRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise GatewayError(
            400, f"invalid feedback{f' ({param})' if param else ''}: {err['msg']}", param=param, code="invalid_value"
        ) from None
    store = gateway.labels
    if store is None:  # only a bare test holder has no label store (the app always opens one)
        raise GatewayError(503, "this gateway keeps no feedback labels", code="not_ready")
    await ctx.admit(None)  # the key's --rpm, before any lookup; no model, no budget: a label spends nothing

    def owner() -> tuple[bool, str | None]:
        found = store.request_owner(spec.request_id)
        if not found[0]:  # answered a moment ago: its record may still be in the writer's queue
            gateway.ledger.flush()
            found = store.request_owner(spec.request_id)
        return found

    found, key_id = await anyio.to_thread.run_sync(owner)
    if not found or not (caller.admin or caller.open or key_id == caller.key_id):
        raise _not_found(spec.request_id)
    good = spec.good if spec.good is not None else spec.score is not None and spec.score >= GOOD_SCORE
    label = LabelRecord(
        request_id=spec.request_id,
        source=LABEL_FEEDBACK,
        good=bool(good),
        verdict="good" if good else "bad",
        key_id=key_id,
        score=spec.score,
    )
    await anyio.to_thread.run_sync(store.add, label)
    return json_response(
        {"object": "feedback", "request_id": spec.request_id, "good": bool(good), "score": spec.score},
        status=201,
    )


def feedback_routes() -> list[Route]:
    return [Route("/v1/feedback", keyed(feedback, body_limit=MAX_FEEDBACK_BODY), methods=["POST"])]
