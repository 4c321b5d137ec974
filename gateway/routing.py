"""Requests to a policy alias: plan the route, call the model, and fall back from a refusing cheap answer.

Self-Route (Li et al., EMNLP 2024): the cheap route answers first from retrieved passages and is told
to say "unanswerable" when they do not suffice; such an answer goes to the long route instead, unless
the policy keeps refusals that the evidence says are right.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
from starlette.requests import Request
from starlette.responses import Response

from gateway.chat import (
    EventStreamResponse, complete_upstream, json_response, malformed_chunk, open_stream, relay_stream, stream_response,
)
from gateway.errors import GatewayError
from gateway.protocol import ChatCompletionRequest
from gateway.request_context import RequestLedgerEntry
from gateway.sse import chunk_usage
from gateway.settings import Settings
from pipelines.base import PreparedPrompt
from pipelines.tokens import count_tokens
from policies.schema import ModelConfig, Policy

logger = logging.getLogger(__name__)

COLLECTION_HEADER = "x-selfroute-collection"


def completion_text(completion: dict[str, Any]) -> str | None:
    choices = completion.get("choices") or []
    if not choices:
        return None
    message = choices[0].get("message") or {}
    if message.get("tool_calls") or message.get("function_call"):
        return "(tool call)"  # a tool call is an action, never a refusal
    return message.get("content")


def _chunk_text(data: bytes) -> str:
    if b'"content"' not in data and b'"tool_calls"' not in data:
        return ""
    try:
        choices = json.loads(data).get("choices") or []
        delta = (choices[0].get("delta") or {}) if choices else {}
    except (ValueError, AttributeError, IndexError) as exc:
        raise malformed_chunk(exc) from None
    if delta.get("tool_calls"):
        return "(tool call)"
    return delta.get("content") or ""


class RoutingService:
    """Owns the document store, pipelines and router; handles chat requests to the policy's aliases."""

    def __init__(self, settings: Settings, policy: Policy, policy_path: Path | None, *, embedder=None):
        self.settings = settings
        self.policy = policy
        self.policy_path = policy_path
        self._embedder = embedder
        self.gateway = None
        self.store = None
        self.planner = None
        self.detector = None

    async def startup(self, gateway) -> None:
        self.gateway = gateway
        await anyio.to_thread.run_sync(self._build)

    def _build(self) -> None:
        from gateway.route_planner import RoutePlanner
        from gateway.router import Router, load_route_model
        from pipelines.embedding import Embedder
        from pipelines.store import DocumentStore
        from pipelines.unanswerable import UnanswerableDetector

        rag = self.policy.rag
        embedder = self._embedder or Embedder(rag.embedding_model, batch_size=rag.embedding_batch_size)
        self.store = DocumentStore(self.settings.store_uri, embedder, rag)
        router = Router(self.policy, load_route_model(self.policy, self.policy_path))
        self.planner = RoutePlanner(self.policy, self.store, router)
        self.detector = UnanswerableDetector(rag.unanswerable_patterns)

    async def shutdown(self) -> None:
        return None

    def routes(self) -> list:
        from gateway.collections_api import collection_routes
        from gateway.explain import explain_route

        from starlette.routing import Route

        return [*collection_routes(), Route("/v1/route/explain", explain_route, methods=["POST"])]

    # -- the request ----------------------------------------------------------------------------
    async def handle(
        self, request: Request, chat: ChatCompletionRequest, body: dict[str, Any], entry: RequestLedgerEntry
    ) -> Response:
        plan = await anyio.to_thread.run_sync(
            self.planner.plan, chat, body["messages"], request.headers.get(COLLECTION_HEADER)
        )
        decision = plan.decision
        entry.record.route, entry.record.reason = decision.route, decision.reason
        route = decision.route
        prepared = await anyio.to_thread.run_sync(self.planner.prepare, plan, route)
        config = self.policy.long if route == "long" else self.policy.cheap
        fallback = route == "rag" and self.policy.routing.fallback.enabled
        if chat.stream:
            if fallback:
                return await self._stream_with_fallback(chat, body, plan, prepared, entry)
            return await self._stream(chat, body, config, route, plan, prepared, entry)
        completion = await self._call(config, body, prepared, route, entry)
        if fallback and self.detector.is_unanswerable(completion_text(completion)):
            if self.planner.router.keep_refusal(decision):
                entry.record.reason = f"{decision.reason}; refusal kept: evidence says the answer is absent"
            else:
                entry.record.route = route = "rag>long"
                entry.record.reason = f"{decision.reason}; cheap answer was unanswerable, fell back to long"
                prepared = await anyio.to_thread.run_sync(self.planner.prepare, plan, "long")
                completion = await self._call(self.policy.long, body, prepared, "long", entry)
        provenance = self.planner.provenance(plan, prepared, route)
        entry.record.provenance = provenance
        entry.counterfactual(self.policy.long, plan.context_tokens)
        entry.finish(200)
        completion["selfroute"] = {
            "route": route, "reason": entry.record.reason, "rule": decision.rule,
            "probability": decision.probability, "request_id": entry.record.id, "provenance": provenance,
        }
        return json_response(completion, headers=self._headers(entry))

    @staticmethod
    def _headers(entry: RequestLedgerEntry) -> dict[str, str]:
        # header values must be latin-1; reasons are ours and ASCII, but be safe
        reason = (entry.record.reason or "").encode("ascii", "replace").decode()
        return {"x-selfroute-route": entry.record.route or "", "x-selfroute-reason": reason}

    @staticmethod
    def _body(body: dict[str, Any], config: ModelConfig, prepared: PreparedPrompt) -> dict[str, Any]:
        return {**body, "model": config.model, "messages": prepared.messages}

    async def _call(
        self, config: ModelConfig, body: dict[str, Any], prepared: PreparedPrompt, route: str,
        entry: RequestLedgerEntry,
    ) -> dict[str, Any]:
        return await complete_upstream(self.gateway, entry, config, route, self._body(body, config, prepared))

    async def _stream(self, chat, body, config, route, plan, prepared, entry) -> Response:
        entry.record.provenance = self.planner.provenance(plan, prepared, route)

        def finish(usage, error) -> None:
            entry.counterfactual(self.policy.long, plan.context_tokens)

        return await stream_response(
            self.gateway, config, self._body(body, config, prepared), entry, route=route,
            client_wants_usage=chat.wants_usage_in_stream, headers=self._headers(entry), finish=finish,
        )

    async def _stream_with_fallback(self, chat, body, plan, prepared, entry) -> Response:
        """Hold the cheap stream until its opening shows it is not a refusal; on a refusal, stream the long answer."""
        cheap = self.policy.cheap
        started = time.perf_counter()
        try:
            first, chunks = await open_stream(self.gateway, cheap, self._body(body, cheap, prepared))
        except GatewayError as exc:
            entry.add_call(cheap, "rag", None, (time.perf_counter() - started) * 1000, exc.message)
            raise
        held: list[bytes] = []
        text = ""
        usage = None
        ended = first is None
        data = first
        try:
            while data is not None:
                held.append(data)
                text += _chunk_text(data)
                try:
                    usage = chunk_usage(data) or usage
                except (ValueError, AttributeError) as exc:
                    raise malformed_chunk(exc) from None
                if len(" ".join(text.split())) > self.detector.head_chars:
                    break  # the opening is settled: later text cannot make it a refusal
                try:
                    data = await chunks.__anext__()
                except StopAsyncIteration:
                    data, ended = None, True
        except GatewayError as exc:  # nothing was sent yet: the client gets a proper status
            entry.add_call(cheap, "rag", usage, (time.perf_counter() - started) * 1000, exc.message)
            await chunks.aclose()
            raise
        decision = plan.decision
        refused = self.detector.is_unanswerable(text)
        if refused and self.planner.router.keep_refusal(decision):
            entry.record.reason = f"{decision.reason}; refusal kept: evidence says the answer is absent"
            refused = False
        if not refused:
            entry.record.provenance = self.planner.provenance(plan, prepared, "rag")

            async def held_then_rest() -> AsyncIterator[bytes]:
                try:
                    for item in held[1:]:
                        yield item
                    if not ended:
                        async for item in chunks:
                            yield item
                finally:
                    await chunks.aclose()  # closing this generator must close the upstream stream too

            def finish_cheap(final_usage, error, status) -> None:
                entry.add_call(cheap, "rag", final_usage, (time.perf_counter() - started) * 1000, error)
                entry.counterfactual(self.policy.long, plan.context_tokens)
                entry.finish(status, error)

            return EventStreamResponse(
                relay_stream(held[0] if held else None, held_then_rest(), chat.wants_usage_in_stream,
                             finish_cheap),
                headers=self._headers(entry),
            )
        # the refusal never reaches the client: close the cheap stream and answer from the long route
        if not ended:
            await chunks.aclose()
        if usage is None:  # cut short before the upstream reported usage: count what was sent and received
            usage = {"prompt_tokens": prepared.prompt_tokens, "completion_tokens": count_tokens(text)}
        entry.add_call(cheap, "rag", usage, (time.perf_counter() - started) * 1000)
        entry.record.route = "rag>long"
        entry.record.reason = f"{decision.reason}; cheap answer was unanswerable, fell back to long"
        long_prepared = await anyio.to_thread.run_sync(self.planner.prepare, plan, "long")
        return await self._stream(chat, body, self.policy.long, "long", plan, long_prepared, entry)
