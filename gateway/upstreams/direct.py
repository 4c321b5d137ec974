"""OpenAI-compatible HTTP upstreams (openai/, hosted_vllm/, bare model names): plain-http ones over the lean
keep-alive client (gateway.upstreams.http1), https ones over a pooled aiohttp session.

litellm costs milliseconds of CPU per call, more than this proxy's whole budget, so these skip it:
no translation, bytes in, bytes out.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import functools
import json
import logging
import os
import ssl
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import orjson
from aiohttp import http_exceptions
from aiohttp.client_proto import ResponseHandler
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from gateway.upstreams import http1
from gateway.upstreams.base import RawCompletion, malformed_answer, split_provider, upstream_error
from gateway.upstreams.errors import UpstreamError, UpstreamTimeout
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)

DIRECT_PROVIDERS = ("openai", "hosted_vllm")
RETRY_STATUSES = (429, 500, 502, 503, 504)
# full-jitter exponential backoff between attempts: up to 0.25 s, 0.5 s, 1 s, ... capped at 8 s
BACKOFF = wait_random_exponential(multiplier=0.25, max=8.0)
# what a kept-alive connection the upstream closed fails with before any answer started (see _send's post)
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, http1.ServerDisconnected)
# a pooled connection lost unanswered within this many seconds of its POST's write is taken for one the upstream's
# idle timer closed as the POST went (its close arrives a round trip after the write at most) and is sent once more;
# lost later, the upstream may have worked on it (a proxy's 60 s timeout): not sent again (see _taken). A gateway
# starved of CPU for longer between the write and reading the close answers 502 where it could have resent
STALE_DROP_S = 1.0
# no connection was made at all: the upstream is unreachable (not resent)
CONNECT_FAILED = (aiohttp.ClientConnectorError, http1.ConnectFailed)
# an exchange that failed without an HTTP answer, from either client (aiohttp's HttpProcessingError is no
# ClientError: its LineTooLong, a streamed line over 512 KiB, was a 500 internal_error)
CLIENT_ERRORS = (aiohttp.ClientError, http_exceptions.HttpProcessingError, http1.HTTPClientError)

Response = aiohttp.ClientResponse | http1.Response
# an upstream asking to wait longer than this is saying "not now": fail instead of holding the client
MAX_RETRY_AFTER_S = 30.0


class _Retryable(Exception):
    """A failed attempt worth repeating; carries the client-facing error and the upstream's Retry-After."""

    def __init__(self, error: UpstreamError, retry_after: float | None = None):
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


def retry_after_seconds(headers: Any, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` (OpenAI's) or `Retry-After` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(float(value) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(moment.timestamp() - (time.time() if now is None else now), 0.0)


def _wait(state: RetryCallState) -> float:
    """The upstream's Retry-After when it sent one, else jittered exponential backoff."""
    failure = state.outcome.exception() if state.outcome else None
    if isinstance(failure, _Retryable) and failure.retry_after is not None:
        return failure.retry_after
    return BACKOFF(state)


def _stop(attempts: int):
    after_attempts = stop_after_attempt(attempts)

    def stop(state: RetryCallState) -> bool:
        failure = state.outcome.exception() if state.outcome else None
        too_long = isinstance(failure, _Retryable) and (failure.retry_after or 0.0) > MAX_RETRY_AFTER_S
        return too_long or after_attempts(state)

    return stop


def error_message(payload: bytes) -> str:
    """The message of an upstream's error body, whatever its shape: OpenAI's `{"error": {"message": ...}}`, any
    other JSON (a list, a string, a number: `[...]`, `"bad request"`, `5`), or text. Never raises."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return payload.decode("utf-8", "replace")[:500] or "no message"
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        message = error.get("message")
        return str(message) if message else json.dumps(error)[:500]
    if isinstance(error, str):
        return error[:500] or "no message"
    return json.dumps(error)[:500]


def _dumps(body: dict[str, Any]) -> bytes:
    """The upstream's request body. orjson: about a fortieth of json.dumps' time on a chat body; json for what
    orjson cannot write (integers past 64 bits, which a client may put in fields passed through unread)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


def _loads(content: bytes) -> Any:
    """An upstream's JSON answer: orjson (a third of json.loads' time), json for what only it reads (NaN,
    Infinity, a byte-order mark); ValueError when neither can."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return json.loads(content)


@functools.lru_cache(maxsize=64)
def _plain_head(url: str, authorization: str | None) -> http1.Head | None:
    """The lean client's request head for a plain-http URL (built once per URL and key), None for https (aiohttp)."""
    if not url.startswith("http://"):
        return None
    headers = {"content-type": "application/json"}
    if authorization:
        headers["authorization"] = authorization
    return http1.Head(url, headers)


def _lines(response: Response) -> AsyncIterator[bytes]:
    return response.lines() if isinstance(response, http1.Response) else response.content.__aiter__()


@functools.lru_cache(maxsize=64)
def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    # one per policy timeout, not one per request: building an aiohttp.ClientTimeout costs ~3 us
    return aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)


class _Handout:
    """One connection aiohttp handed out for one POST: whether it was pooled (handed out before), whether bytes of
    an answer came on it and when it was lost (its protocol sets those two), and when it was handed out (the POST is
    written straight after). The posting task's context holds it, not the protocol, which may be gone by the time
    the failure is judged."""

    __slots__ = ("reused", "heard", "handed_at", "lost_at")

    def __init__(self, reused: bool) -> None:
        self.reused = reused
        self.heard = False
        self.handed_at = time.monotonic()
        self.lost_at: float | None = None


# the latest connection aiohttp handed this task (set by _ReuseTellingConnector.connect, which runs in the task that
# posts: session.post awaits it directly); None: none was made
_HANDOUT: contextvars.ContextVar[_Handout | None] = contextvars.ContextVar("selfroute_handout", default=None)


class _AnswerTellingHandler(ResponseHandler):
    """aiohttp's protocol, noting when bytes of an answer come: a connection reset (RST, not a close) after part of
    an answer's head raises ClientOSError, which drops what was parsed (the upstream took the POST)."""

    ticket: _Handout | None = None

    def data_received(self, data: bytes) -> None:
        if data and self.ticket is not None:
            self.ticket.heard = True
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.ticket is not None and self.ticket.lost_at is None:
            self.ticket.lost_at = time.monotonic()
        super().connection_lost(exc)


class _ReuseTellingConnector(aiohttp.TCPConnector):
    """aiohttp raises the same ServerDisconnectedError whether the connection was pooled or made for the POST; this
    connector tells which: a connection whose protocol it handed out before is a reused one. aiohttp's TraceConfig
    (on_connection_reuseconn) says the same but builds its trace objects and URLs on every call: 58-88 us more CPU
    per call, against 0.6 us for this one's own work (tests/benchmarks/bench_reuse_trace.py, BENCHMARKS.md)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed: weakref.WeakSet[Any] = weakref.WeakSet()
        # the protocol aiohttp makes for each connection (a private attribute: tests/upstreams/test_direct.py's reset
        # test fails if aiohttp stops using it)
        self._factory = cast(
            "functools.partial[ResponseHandler]", functools.partial(_AnswerTellingHandler, loop=self._loop)
        )

    async def connect(self, req: Any, traces: Any, timeout: Any) -> aiohttp.connector.Connection:
        _HANDOUT.set(None)  # a connection that fails to open was not reused either
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is not None:
            handout = _Handout(reused=protocol in self._handed)
            self._handed.add(protocol)
            if isinstance(protocol, _AnswerTellingHandler):
                protocol.ticket = handout  # the previous answer on it was read whole before it was pooled
            _HANDOUT.set(handout)
        return connection


def _taken(exc: BaseException) -> bool:
    """Whether the upstream may have taken a POST that failed unanswered, so that sending it again could run it twice,
    uncharged: part of an answer came; or the connection was made for it (no idle timer closed it: the probes saw
    every such POST reach the upstream twice, on plain http then on https); or the connection was lost over
    STALE_DROP_S after the POST was written (a proxy's timeout, an upstream that worked on it and died). Resent is only
    the stale keep-alive race: a pooled connection the upstream's idle timer closed as it was handed the POST, whose
    close comes a round trip after the write at most."""
    if isinstance(exc, http1.ServerDisconnected):
        return exc.answered or exc.fresh or exc.waited > STALE_DROP_S
    # aiohttp's ServerDisconnectedError carries the answer's head parsed so far, or its default text when none came
    answered = isinstance(exc, aiohttp.ServerDisconnectedError) and not isinstance(exc.message, str)
    handout = _HANDOUT.get()
    if answered or handout is None or handout.heard or not handout.reused:
        return True
    lost_at = handout.lost_at if handout.lost_at is not None else time.monotonic()  # a write that failed: now
    return lost_at - handout.handed_at > STALE_DROP_S


def _secret_env(config: ModelConfig) -> tuple[str, ...]:
    """The environment variable holding this upstream's key, whose value never appears in an error."""
    return (config.api_key_env,) if config.api_key_env else ()


class DirectOpenAIUpstream:
    """OpenAI-compatible HTTP upstreams: no translation, bytes in, bytes out. Plain http over the lean client
    (gateway.upstreams.http1: about 100 us less CPU per call than aiohttp), https over aiohttp.

    aiohttp rather than httpx: on this path httpx cost about 2 ms of CPU per request, over the proxy's budget.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        """`ssl_context`: whom https upstreams are trusted by (None: the system's certificate authorities)."""
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._pool: http1.Pool | None = None

    def _plain(self) -> http1.Pool:
        # created lazily, like the session: it belongs to the event loop it was made in (a CLI command that runs
        # one loop after another gets a pool for each)
        pool = self._pool
        if pool is None or pool.closed or pool.loop is not asyncio.get_running_loop():
            pool = self._pool = http1.Pool(limit=512)
        return pool

    def _client(self) -> aiohttp.ClientSession:
        # created lazily: a session belongs to the event loop it was made in
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=_ReuseTellingConnector(limit=512, ttl_dns_cache=300, ssl=self._ssl or True),
                auto_decompress=True,
            )
        return self._session

    @staticmethod
    def _endpoint(config: ModelConfig) -> tuple[str, dict[str, str], str]:
        provider, name = split_provider(config.model)
        base = (
            config.api_base
            or (os.environ.get("HOSTED_VLLM_API_BASE") if provider == "hosted_vllm" else None)
            or os.environ.get("OPENAI_API_BASE")
            or os.environ.get("OPENAI_BASE_URL")
            or "https://api.openai.com/v1"
        )
        key_env = config.api_key_env or ("HOSTED_VLLM_API_KEY" if provider == "hosted_vllm" else "OPENAI_API_KEY")
        key = os.environ.get(key_env)
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        return base.rstrip("/") + "/chat/completions", headers, name

    async def _send(self, config: ModelConfig, body: dict[str, Any]) -> Response:
        url, headers, name = self._endpoint(config)
        payload = _dumps({**body, "model": name})
        head = _plain_head(url, headers.get("authorization"))

        async def send() -> Response:
            if head is not None:
                return await self._plain().post(head, payload, config.timeout)
            return await self._client().post(url, data=payload, headers=headers, timeout=_timeout(config.timeout))

        async def post() -> Response:
            try:
                return await send()
            except CONNECT_FAILED:
                raise  # no connection was made: the upstream is unreachable, not a stale pooled connection
            except STALE_CONNECTION as exc:
                if _taken(exc):
                    raise
                # an upstream closes idle kept-alive connections (uvicorn after 5 s); one closed as the pool handed
                # it out fails before any answer, at once ("Can not write request body", "Server disconnected").
                # aiohttp resends only idempotent methods (RFC 9112 9.3.1), so this POST is sent once more here
                return await send()

        async def attempt() -> Response:
            try:
                response = await post()
            except TimeoutError:
                raise _Retryable(
                    UpstreamTimeout(
                        f"upstream model {config.model!r} timed out after {config.timeout:g}s", model=config.model
                    )
                ) from None
            except CLIENT_ERRORS as exc:
                raise _Retryable(
                    upstream_error(None, f"{type(exc).__name__}: {exc}", config.model, _secret_env(config))
                ) from None
            if response.status < 400:
                return response
            try:
                content = await response.read()
            except (TimeoutError, *CLIENT_ERRORS):
                content = b""  # the status says what failed; its message was cut off
            finally:
                response.release()  # always: the lean client's connection slot is held until then
            error = upstream_error(response.status, error_message(content), config.model, _secret_env(config))
            if response.status not in RETRY_STATUSES:
                raise error
            raise _Retryable(error, retry_after_seconds(response.headers))

        # the first attempt runs without tenacity: its retrying objects form reference cycles, garbage that
        # made the cyclic collector run (and stall the event loop) every few hundred pass-through requests
        try:
            return await attempt()
        except _Retryable as exc:
            failures = [exc]

        async def replay_then_attempt() -> Response:
            if failures:  # tenacity counts and waits from the first failure as if it had made that attempt
                raise failures.pop()
            return await attempt()

        retrying = AsyncRetrying(
            stop=_stop(config.max_retries + 1), wait=_wait, retry=retry_if_exception_type(_Retryable), reraise=True
        )
        try:
            return await retrying(replay_then_attempt)
        except _Retryable as exc:
            exc.error.retry_after = exc.retry_after  # the client hears when to come back (probe11: it was dropped)
            raise exc.error from None

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._send(config, {**body, "stream": False})
        try:
            content = await response.read()
        except TimeoutError:
            raise UpstreamTimeout(f"upstream model {config.model!r} timed out", model=config.model) from None
        except CLIENT_ERRORS as exc:
            raise upstream_error(None, f"reading the answer failed: {exc}", config.model) from None
        finally:
            response.release()
        try:
            parsed = _loads(content)
        except ValueError:
            raise malformed_answer(config.model, "the body is not JSON") from None
        if not isinstance(parsed, dict):
            return parsed  # refused as malformed by the caller (check_completion)
        completion = RawCompletion(parsed)
        completion.raw = content
        return completion

    async def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]:
        response = await self._send(config, {**body, "stream": True})
        try:
            kind = response.headers.get("content-type", "")
            if kind and not kind.startswith("text/event-stream"):
                # a JSON answer (or an HTML page) to a stream request: relaying nothing would look like an empty 200
                content = await response.read()
                raise malformed_answer(
                    config.model,
                    f"asked for a stream, it answered {kind.split(';')[0]}: {error_message(content)[:200]}",
                )
            async for line in _lines(response):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                if data:
                    yield data
        except TimeoutError:
            raise UpstreamTimeout(f"upstream model {config.model!r} timed out mid-stream", model=config.model) from None
        except CLIENT_ERRORS as exc:
            raise upstream_error(None, f"stream broke: {exc}", config.model) from None
        finally:
            response.release()

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._session is not None:
            await self._session.close()
