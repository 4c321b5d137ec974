"""POST /v1/route/explain: the routing decision for a chat body, with estimates, and no LLM call."""
from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response

from gateway.chat import json_response, read_body
from gateway.protocol import parse_chat_request

DEFAULT_COMPLETION_ESTIMATE = 256


def _estimate(gateway, planner, plan, route: str, completion_tokens: int) -> dict:
    prepared = planner.prepare(plan, route)
    config = gateway.policy.long if route == "long" else gateway.policy.cheap
    price = gateway.prices.price(config)
    return {
        "model": config.model,
        "prompt_tokens": prepared.prompt_tokens,
        "completion_tokens_estimate": completion_tokens,
        "cost_usd": price.cost(prepared.prompt_tokens, completion_tokens),
        "price_source": price.source,
    }


def explain_plan(gateway, chat, body, header_collection: str | None) -> dict:
    planner = gateway.routing.planner
    plan = planner.plan(chat, body["messages"], header_collection)
    completion = chat.max_completion_tokens or chat.max_tokens or DEFAULT_COMPLETION_ESTIMATE
    decision = plan.decision
    estimates = {route: _estimate(gateway, planner, plan, route, completion) for route in ("direct", "rag", "long")}
    classifier = gateway.policy.routing.classifier
    return {
        "object": "route.explanation",
        "route": decision.route,
        "reason": decision.reason,
        "rule": decision.rule,
        "probability": decision.probability,
        "threshold": classifier.threshold if classifier else None,
        "source": plan.source,
        "question": plan.context.question,
        "context_tokens": plan.context_tokens,
        "features": {k: (None if v != v else v) for k, v in decision.features.items()},  # NaN is not JSON
        "estimates": estimates,
        "fallback": gateway.policy.routing.fallback.model_dump(),
    }


async def explain_route(request: Request) -> Response:
    gateway = request.app.state.gateway
    gateway.auth.check(request)
    raw = await read_body(request, gateway.settings.max_body_bytes)
    chat, body = parse_chat_request(raw)
    result = await anyio.to_thread.run_sync(
        explain_plan, gateway, chat, body, request.headers.get("x-selfroute-collection")
    )
    return json_response(result)
