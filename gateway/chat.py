"""POST /v1/chat/completions: validation, pass-through, and hand-off to routing for policy aliases."""
from __future__ import annotations

import json
import logging
import time
from typing import Any, AsyncIterator, Callable

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from gateway.errors import GatewayError
from gateway.local_model import is_packaged_local_model
from gateway.protocol import ChatCompletionRequest, parse_chat_request
from gateway.request_context import RequestLedgerEntry
from gateway.sse import DONE, chunk_usage, sse_event, sse_json
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)

JSON_HEADERS = {"content-type": "application/json"}


async def read_body(request: Request, limit: int) -> bytes:
    too_large = GatewayError(413, f"request body is larger than the gateway's limit of {limit} bytes",
                             code="body_too_large")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise too_large
    except ClientDisconnect:
        raise GatewayError(400, "client disconnected while sending the body", code="client_disconnected") from None
    return bytes(body)


def json_response(payload: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload).encode(), status_code=status, headers={**JSON_HEADERS, **(headers or {})})


async def chat_completions(request: Request) -> Response:
    gateway = request.app.state.gateway
    entry = RequestLedgerEntry(gateway.ledger, gateway.prices, request.state.request_id, gateway.policy.name)
    try:
        caller = gateway.auth.check(request)
        entry.record.key_id = caller.key_id
        raw = await read_body(request, gateway.settings.max_body_bytes)
        chat, body = parse_chat_request(raw)
        entry.record.alias = chat.model
        entry.record.stream = bool(chat.stream)
        if chat.model in gateway.policy.aliases:
            return await gateway.routing.handle(request, chat, body, entry)
        return await pass_through(gateway, chat, body, entry)
    except GatewayError as exc:
        entry.finish(exc.status, exc.message)
        return exc.response()
    except Exception as exc:  # logged once here, answered with the envelope, never a traceback
        logger.exception("chat completion %s failed", entry.record.id)
        entry.finish(500, f"internal error: {type(exc).__name__}: {exc}")
        return GatewayError(500, "internal error in the gateway; see the gateway log", code="internal_error").response()


def passthrough_config(policy, model: str) -> ModelConfig:
    """A model named in the policy keeps its settings (base, key, prices); any other name goes as is,
    except in-process models: a client may only run the packaged one or those the policy names, never
    make the gateway load an arbitrary file from its disk."""
    for config in (policy.cheap, policy.long):
        if config.model == model:
            return config
    if model.startswith("local/") and not is_packaged_local_model(model):
        raise GatewayError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
    return ModelConfig(model=model)


async def pass_through(gateway, chat: ChatCompletionRequest, body: dict[str, Any], entry: RequestLedgerEntry) -> Response:
    entry.record.route = "passthrough"
    entry.record.reason = "model is not a routed alias"
    config = passthrough_config(gateway.policy, chat.model)
    if chat.stream:
        return await stream_response(gateway, config, body, entry, route="passthrough",
                                     client_wants_usage=chat.wants_usage_in_stream)
    completion = await complete_upstream(gateway, entry, config, "passthrough", body)
    entry.finish(200)
    return json_response(completion)


async def complete_upstream(
    gateway, entry: RequestLedgerEntry, config: ModelConfig, route: str, body: dict[str, Any]
) -> dict[str, Any]:
    """One non-streaming upstream call, recorded as a leg of the request whether it succeeds or fails."""
    started = time.perf_counter()
    try:
        completion = await gateway.upstream.complete(config, body)
    except GatewayError as exc:
        entry.add_call(config, route, None, (time.perf_counter() - started) * 1000, exc.message)
        raise
    entry.add_call(config, route, completion.get("usage"), (time.perf_counter() - started) * 1000)
    return completion


async def open_stream(gateway, config: ModelConfig, body: dict[str, Any]) -> tuple[bytes | None, AsyncIterator[bytes]]:
    """Start an upstream stream and wait for its first chunk, so failures still get a proper status."""
    upstream_body = {**body, "stream": True, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
    chunks = gateway.upstream.stream(config, upstream_body).__aiter__()
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        first = None
    return first, chunks


Finish = Callable[[dict[str, Any] | None, str | None], None]
CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before the stream ended


async def stream_response(
    gateway, config: ModelConfig, body: dict[str, Any], entry: RequestLedgerEntry, *, route: str,
    client_wants_usage: bool, headers: dict[str, str] | None = None, finish: Finish | None = None,
) -> Response:
    """Stream one upstream call to the client; `finish(usage, error)` runs before the ledger entry closes."""
    started = time.perf_counter()
    try:
        first, chunks = await open_stream(gateway, config, body)
    except GatewayError as exc:
        entry.add_call(config, route, None, (time.perf_counter() - started) * 1000, exc.message)
        raise

    def finish_call(usage: dict[str, Any] | None, error: str | None, status: int) -> None:
        entry.add_call(config, route, usage, (time.perf_counter() - started) * 1000, error)
        if finish is not None:
            finish(usage, error)
        entry.finish(status, error)

    return EventStreamResponse(relay_stream(first, chunks, client_wants_usage, finish_call), headers=headers)


class EventStreamResponse(StreamingResponse):
    """SSE that always watches for the client leaving (Starlette only does so for older ASGI servers), so
    an abandoned stream stops pulling, and paying for, upstream tokens at once instead of at its end."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], headers: dict[str, str] | None = None):
        super().__init__(content, headers={"cache-control": "no-cache", **(headers or {})})

    async def __call__(self, scope, receive, send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                try:
                    await self.stream_response(send)
                except OSError:  # the socket went away mid-write
                    pass
                group.cancel_scope.cancel()

            group.start_soon(stream)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()


def malformed_chunk(exc: Exception) -> GatewayError:
    return GatewayError(502, f"the upstream sent a malformed stream chunk: {exc}", code="upstream_error")


async def relay_stream(
    first: bytes | None, chunks: AsyncIterator[bytes], client_wants_usage: bool,
    finish: Callable[[dict[str, Any] | None, str | None, int], None],
) -> AsyncIterator[bytes]:
    """Forward upstream chunks; note usage for the ledger; drop the usage chunk the client did not ask for.

    `finish(usage, error, status)` runs exactly once, however the stream ends. The HTTP status was 200
    when the headers went out; the ledger records how the request really ended (an error's status, or
    499 when the client left), so failed streams show up as failures in the reports.
    """
    usage = None
    finished = False

    async def end(error: str | None, status: int) -> None:
        # settle the ledger before the last event goes out: a client that has read [DONE] finds its row
        nonlocal finished
        finished = True
        with anyio.CancelScope(shield=True):  # close the upstream even while being cancelled
            closer = getattr(chunks, "aclose", None)
            if closer is not None:
                await closer()
        finish(usage, error, status)

    try:
        data = first
        while data is not None:
            try:
                found = chunk_usage(data)
                forward = found is None or client_wants_usage or bool(json.loads(data).get("choices"))
            except (ValueError, AttributeError) as exc:
                raise malformed_chunk(exc) from None
            if found is not None:
                usage = found
            if forward:
                yield sse_event(data)
            try:
                data = await chunks.__anext__()
            except StopAsyncIteration:
                data = None
        await end(None, 200)
        yield DONE
    except GatewayError as exc:
        await end(exc.message, exc.status)
        yield sse_json(exc.body())
        yield DONE
    except Exception as exc:  # a broken upstream must still end the stream with an error event, not a cut
        logger.exception("stream relay failed")
        failure = GatewayError(502, f"upstream stream failed: {type(exc).__name__}: {exc}", code="upstream_error")
        await end(failure.message, failure.status)
        yield sse_json(failure.body())
        yield DONE
    finally:
        if not finished:
            await end("client disconnected before the stream ended", CLIENT_CLOSED)
