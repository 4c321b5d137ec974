"""POST /v1/route/explain: the routing decision for a chat body, with estimates, and no LLM call."""
from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response

from gateway.protocol import parse_chat_request
from gateway.routing.explain import explain_plan
from gateway.server import headers
from gateway.server.bodies import json_response, read_body
from gateway.server.collections import check_collection_access, requested_collection
from gateway.server.injection import flag_headers, screen_attached
from gateway.server.state import gateway_of
from pipelines.embedding import scope_queries


async def explain_route(request: Request) -> Response:
    gateway = gateway_of(request)
    caller = gateway.auth.check(request)
    raw = await read_body(request, gateway.settings.max_body_bytes)
    chat, body = parse_chat_request(raw)
    chat.scope_to(caller.key_id)
    scope_queries(caller.key_id)
    found = await screen_attached(gateway.policy, chat)
    check_collection_access(gateway, caller, requested_collection(chat, request))
    planner = gateway.routing.ready_planner()
    result = await anyio.to_thread.run_sync(
        explain_plan, gateway.policy, gateway.prices, planner, chat, body["messages"],
        request.headers.get(headers.COLLECTION), gateway.routing.warm,
    )
    if found:
        result["flags"] = found
    return json_response(result, headers=flag_headers(found))
