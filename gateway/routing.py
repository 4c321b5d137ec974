"""Requests to a policy alias: choose a route, prepare its context, call the model, fall back."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.chat import json_response, stream_response
from gateway.errors import GatewayError
from gateway.protocol import ChatCompletionRequest
from gateway.request_context import RequestLedgerEntry
from gateway.settings import Settings
from policies.schema import Policy

logger = logging.getLogger(__name__)


class RoutingService:
    def __init__(self, settings: Settings, policy: Policy, policy_path: Path | None):
        self.settings = settings
        self.policy = policy
        self.policy_path = policy_path
        self.gateway = None

    async def startup(self, gateway) -> None:
        self.gateway = gateway

    async def shutdown(self) -> None:
        return None

    def routes(self) -> list:
        return []

    async def handle(
        self, request: Request, chat: ChatCompletionRequest, body: dict[str, Any], entry: RequestLedgerEntry
    ) -> Response:
        gateway = self.gateway
        config = self.policy.long
        entry.record.route, entry.record.reason = "long", "router not configured: routed aliases use the long model"
        headers = {"x-selfroute-route": "long", "x-selfroute-reason": entry.record.reason}
        body = {**body, "model": config.model}
        if chat.stream:
            return await stream_response(gateway, config, body, entry, route="long",
                                         client_wants_usage=chat.wants_usage_in_stream, headers=headers)
        started = time.perf_counter()
        try:
            completion = await gateway.upstream.complete(config, body)
        except GatewayError as exc:
            entry.add_call(config, "long", None, (time.perf_counter() - started) * 1000, exc.message)
            raise
        entry.add_call(config, "long", completion.get("usage"), (time.perf_counter() - started) * 1000)
        entry.finish(200)
        return json_response(completion, headers=headers)
