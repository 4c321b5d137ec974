"""A client that leaves before its answer stops the work: the upstream call is cancelled and the request
is ledgered as 499, at once rather than when the upstream would have answered. Under uvicorn's own protocol a task
watches receive(); under `selfroute serve`'s (HeaderDeadlineProtocol) the connection's connection_lost tells the
request through its scope's DisconnectHook: both are tested."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from gateway.commands._http_deadline import HeaderDeadlineProtocol
from gateway.server.disconnect import DISCONNECT_HOOK
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import DROP, make_policy

# the long model answers after 30 s
POLICY = {
    "cheap": {"context_window": DROP},
    "long": {"model": "openai/sleep-30", "timeout": 120, "context_window": DROP},
}


# uvicorn's default protocol (a watcher task), and serve's (the connection's hook)
PROTOCOLS = pytest.mark.parametrize("http", [None, HeaderDeadlineProtocol], ids=["uvicorn", "serve"])


@PROTOCOLS
@pytest.mark.parametrize("model", ["selfroute", "openai/sleep-30"])
def test_client_leaving_a_non_streaming_request_is_ledgered_as_499_at_once(upstream, tmp_path, model, http):
    with running_gateway(tmp_path, make_policy(upstream[0], **POLICY), http=http) as (url, app):
        body = {"model": model, "messages": [{"role": "user", "content": "Take your time."}]}
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{url}/v1/chat/completions",
                content=json.dumps(body),
                headers={"content-type": "application/json"},
                timeout=1.0,
            )
        rows = []
        while time.monotonic() - started < 20 and not rows:
            time.sleep(0.1)
            rows = ledger_rows(app)
        assert rows, "the request never reached the ledger"
        assert rows[0]["status"] == 499 and "disconnected" in rows[0]["error"]
        assert rows[0]["latency_ms"] < 15_000  # stopped when the client left, not after the upstream's 30 s
        # the gateway is fine afterwards
        ok = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert ok.status_code == 200


@PROTOCOLS
def test_client_leaving_mid_stream_stops_the_upstream_and_is_ledgered_as_499(upstream, tmp_path, http, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")  # pass-through names go there
    with running_gateway(tmp_path, make_policy(upstream[0]), http=http) as (url, app):
        started = time.monotonic()
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json={"model": "openai/dribble", "stream": True, "messages": [{"role": "user", "content": "x"}]},
        ) as response:
            assert next(response.iter_lines()).startswith("data: ")
        # the upstream would stream for 10 s; the gateway must notice the client left long before that
        rows = []
        while not rows and time.monotonic() - started < 8:
            rows = ledger_rows(app)
            time.sleep(0.05)
        assert rows, "the request never reached the ledger"
        assert rows[0]["status"] == 499 and "client disconnected" in rows[0]["error"]
        assert rows[0]["latency_ms"] < 5_000
        ok = httpx.post(  # and a request on a new connection is answered whole
            f"{url}/v1/chat/completions",
            timeout=60,
            json={"model": "openai/fake-cheap", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert ok.status_code == 200 and ok.text.rstrip().endswith("data: [DONE]")
        assert ledger_rows(app)[-1]["status"] == 200


def test_serve_protocol_gives_each_request_its_own_hook_and_only_unfinished_ones_hear_the_loss():
    """On a kept-alive connection: a finished request's hook is not called when the connection goes later; an
    unfinished one's callback runs once. Each hook says whether its request's body has all arrived."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    class Transport:
        def __init__(self):
            self.closed = False

        def get_extra_info(self, name, default=None):
            return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

        def write(self, data):
            pass

        def is_closing(self):
            return self.closed

        def close(self):
            self.closed = True

        def pause_reading(self):
            pass

        def resume_reading(self):
            pass

        def set_protocol(self, protocol):
            pass

    import asyncio

    scopes = []

    async def app(scope, receive, send):
        scopes.append(scope)
        if len(scopes) == 1:  # the first is answered; the second never is
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
        else:
            await asyncio.sleep(30)

    async def run() -> list[str]:
        config = Config(app, log_level="warning")
        config.load()
        protocol = HeaderDeadlineProtocol(config, ServerState(), app_state={})
        protocol.connection_made(Transport())
        heard = []
        protocol.data_received(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await asyncio.sleep(0.05)
        protocol.data_received(b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await asyncio.sleep(0.05)
        first, second = (scope["extensions"][DISCONNECT_HOOK] for scope in scopes)
        assert first is not second
        assert first.body_received and second.body_received  # each arrived whole: read without a timer
        protocol.data_received(b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n12345")
        await asyncio.sleep(0.05)
        assert not protocol._hooks[-1].body_received  # half of it: gateway.server.bodies arms its timer
        first.callback = lambda: heard.append("first")  # answered already: must not hear of the loss
        second.callback = lambda: heard.append("second")
        protocol.connection_lost(None)
        assert heard == ["second"]
        second.lost()  # once only: a second call finds no callback
        for task in protocol.tasks:
            task.cancel()
        await asyncio.sleep(0)
        return heard

    assert asyncio.run(run()) == ["second"]


@PROTOCOLS
@pytest.mark.parametrize("stream", [False, True])
def test_a_finished_request_leaves_no_reference_cycles(upstream, tmp_path, stream, http):
    """A pass-through request must not leave garbage that only the cyclic collector frees (a cancelled watcher's
    CancelledError, its traceback and frames; tenacity's retry objects; the ledger entry and its reservation, whose
    `prepare` held the entry): under load, collecting it stalled the event loop for hundreds of milliseconds, and
    the young collections' pace (gateway.server.app.YOUNG_COLLECTION_THRESHOLD) counts on there being none."""
    import gc
    import threading

    from gateway.server.app import YOUNG_COLLECTION_THRESHOLD

    with running_gateway(tmp_path, make_policy(upstream[0], **POLICY), http=http) as (url, _app):
        for thread in threading.enumerate():  # the gateway freezes what it loaded once: not during the count
            if thread.name == "selfroute-gc-freeze":
                thread.join(timeout=120)
        assert gc.get_threshold()[0] >= YOUNG_COLLECTION_THRESHOLD
        body = {"model": "openai/fake-cheap", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=60) as client:
            client.post(f"{url}/v1/chat/completions", json=body).read()  # warm
            time.sleep(0.5)
            gc.collect()
            gc.disable()
            try:
                for _ in range(20):
                    response = client.post(f"{url}/v1/chat/completions", json=body)
                    assert response.status_code == 200
                time.sleep(0.5)  # watchers end once their answer is sent; the ledger has taken the rows
                gc.set_debug(gc.DEBUG_SAVEALL)
                gc.collect()
                kinds = {type(o).__name__ for o in gc.garbage}
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
    assert not kinds & {"CancelledError", "AsyncRetrying", "RequestLedgerEntry", "Reservation", "RequestRecord"}, kinds


def test_unless_disconnected_turns_the_client_leaving_into_client_disconnected_and_a_shutdown_into_cancellation():
    """With serve's hook: the client leaving cancels the work, sets the threads' stop flag and ends as
    ClientDisconnected with the task's cancellation taken back; a cancellation from elsewhere (a shutdown) goes on
    as one, the flag set too; a finished request leaves no callback on the hook."""
    import asyncio

    from starlette.requests import Request

    from gateway.server.disconnect import ClientDisconnected, DisconnectHook, unless_disconnected
    from pipelines.cancellation import cancelled

    def request(hook: DisconnectHook) -> Request:
        return Request({"type": "http", "method": "POST", "headers": [], "extensions": {DISCONNECT_HOOK: hook}})

    async def run() -> None:
        threads: list[asyncio.Future] = []  # a worker thread of each request, waiting for its stop flag

        def wait_for_stop() -> bool:
            deadline = time.monotonic() + 5
            while not cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            return cancelled()

        async def slow() -> str:
            threads.append(asyncio.ensure_future(asyncio.to_thread(wait_for_stop)))  # the request's context
            await asyncio.sleep(30)
            return "never"

        hook = DisconnectHook()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, hook.lost)  # the connection goes
        try:
            await unless_disconnected(request(hook), slow)
            raise AssertionError("no ClientDisconnected")
        except ClientDisconnected:
            pass
        assert await threads[-1] and asyncio.current_task().cancelling() == 0 and hook.callback is None
        await asyncio.sleep(0)  # the task is not cancelled any more

        async def shutdown() -> None:
            inner = asyncio.current_task()
            loop.call_later(0.05, inner.cancel)
            await unless_disconnected(request(DisconnectHook()), slow)

        try:
            await asyncio.create_task(shutdown())
            raise AssertionError("not cancelled")
        except asyncio.CancelledError:
            pass
        assert await threads[-1]

        async def quick() -> str:
            return "ok"

        hook = DisconnectHook()
        assert await unless_disconnected(request(hook), quick) == "ok"
        assert hook.callback is None
        hook.lost()  # after the answer: nothing to cancel

    asyncio.run(run())


def test_a_client_that_left_before_the_request_was_watched_is_a_disconnect():
    """The probe's finding (round seven): under serve's protocol a client that left while the event loop was busy,
    before the request reached unless_disconnected, was never heard of: the hook had no callback when the server
    called lost(), so the request ran on, called the upstream and was ledgered as a 200 answered to no one
    (uvicorn's own watcher reads the disconnect from receive() whenever it starts)."""
    import asyncio

    from starlette.requests import Request

    from gateway.server.disconnect import ClientDisconnected, DisconnectHook, unless_disconnected

    async def run() -> None:
        hook = DisconnectHook()
        hook.lost()  # the connection went before anyone watched
        ran: list[str] = []

        async def work() -> str:
            await asyncio.sleep(0.5)
            ran.append("upstream called")
            return "answered to no one"

        scope = {"type": "http", "method": "POST", "headers": [], "extensions": {DISCONNECT_HOOK: hook}}
        with pytest.raises(ClientDisconnected):
            await unless_disconnected(Request(scope), work)
        assert ran == [] and hook.callback is None

    asyncio.run(run())


def test_serve_protocol_reads_on_once_a_large_body_is_whole():
    """uvicorn pauses reading while more than 64 kB of body wait unread and resumes only when the app asks for more.
    A body whose last part was over 64 kB left the connection paused until the response ended: the client leaving
    was never heard (no connection_lost), the request ran on and was ledgered 200 (round seven's held cheap stream
    whose client left at 2.2 s). serve's protocol reads on once the body is whole."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    class Transport:
        paused = False

        def get_extra_info(self, name, default=None):
            return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

        def write(self, data):
            pass

        def is_closing(self):
            return False

        def close(self):
            pass

        def pause_reading(self):
            self.paused = True

        def resume_reading(self):
            self.paused = False

        def set_protocol(self, protocol):
            pass

    import asyncio

    got = []

    async def app(scope, receive, send):
        while True:  # the whole body, as gateway.server.bodies reads it
            message = await receive()
            got.append(len(message.get("body", b"")))
            if not message.get("more_body"):
                break
        await asyncio.sleep(30)  # waiting on the upstream

    async def run() -> None:
        config = Config(app, log_level="warning")
        config.load()
        protocol = HeaderDeadlineProtocol(config, ServerState(), app_state={})
        transport = Transport()
        protocol.connection_made(transport)
        protocol.data_received(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 150000\r\n\r\n" + b"x" * 70_000)
        await asyncio.sleep(0.05)  # the app has the first part and waits for more: reading resumed
        assert not transport.paused
        protocol.data_received(b"y" * 80_000)  # the last part, over 64 kB: uvicorn pauses reading
        await asyncio.sleep(0.05)
        assert got == [70_000, 80_000]
        assert not transport.paused  # still reading: a client that closes now is heard (connection_lost)
        for task in protocol.tasks:
            task.cancel()
        await asyncio.sleep(0)

    asyncio.run(run())


@PROTOCOLS
def test_a_client_that_resets_the_connection_mid_body_is_ledgered_as_499(upstream, tmp_path, http):
    """probe11: a client that sent half its body and reset the connection was ledgered as a 400, as if it had sent
    something wrong; it left, like any other client that leaves (499)."""
    import socket
    import struct

    with running_gateway(tmp_path, make_policy(upstream[0], **POLICY), http=http) as (url, app):
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "x" * 5000}]})
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Request-Id: half-body\r\n\r\n"
        ).encode()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(head + body[: len(body) // 2].encode())
        time.sleep(0.3)  # the gateway is reading the body
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        sock.close()
        rows: list[dict] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not rows:
            time.sleep(0.1)
            rows = [r for r in ledger_rows(app) if r["client_request_id"] == "half-body"]
        assert len(rows) == 1, "the request never reached the ledger"
        assert (rows[0]["status"], rows[0]["error"]) == (499, "client disconnected while sending the body")
        assert ledger_rows(app, "requests_in_flight") == []
