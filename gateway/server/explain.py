"""POST /v1/route/explain: the routing decision for a chat body, with estimates, and no LLM call.

Admitted and metered like chat (planning can embed attached documents): its ledger record is a pass-through
with reason "explain" and no legs."""

from __future__ import annotations

import anyio
from starlette.responses import Response

from gateway.protocol import parse_chat_request
from gateway.routing.embedding_model import embedding_config
from gateway.routing.explain import explain_plan
from gateway.server import headers
from gateway.server.bodies import json_response
from gateway.server.collections import check_collection_access, requested_collection
from gateway.server.context import RequestContext
from gateway.server.injection import flag_headers, screen_attached
from pipelines.messages import content_text
from policies.routes import PASSTHROUGH

EXPLAIN_REASON = "explain"


async def explain_route(ctx: RequestContext) -> Response:
    gateway, entry = ctx.gateway, ctx.entry
    assert entry is not None  # metered
    entry.record.route, entry.record.reason = PASSTHROUGH, EXPLAIN_REASON
    chat, body = parse_chat_request(ctx.body)
    # planning embeds attached documents (or indexes a long conversation) as a chat request would: their tokens are
    # held against the key's TPM like a document post's, else a burst of explains embedded without limit (the probe:
    # 10 at once with ~10k-token documents each all passed TPM 20,000)
    documents = chat.selfroute.documents if chat.selfroute and chat.selfroute.documents else None
    texts = [d.text for d in documents] if documents else [content_text(m.get("content")) for m in body["messages"]]
    await ctx.admit(chat.model, embedded=(embedding_config(gateway.policy), texts))
    found = await screen_attached(gateway.policy, chat, ctx.scope)
    check_collection_access(gateway, ctx.caller, requested_collection(chat, ctx.request))
    gateway.check_ready()
    planner = gateway.routing.ready_planner()
    result = await anyio.to_thread.run_sync(
        explain_plan,
        gateway.policy,
        gateway.prices,
        planner,
        chat,
        body["messages"],
        ctx.request.headers.get(headers.COLLECTION),
        gateway.routing.warm,
        ctx.scope,
        entry,
    )
    if found:
        result["flags"] = found
    return json_response(result, headers=flag_headers(found))
