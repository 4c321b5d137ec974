"""serve's HTTP protocol (gateway.commands._http_deadline): one socket write per whole answer, nothing lost."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.commands._http_deadline import HeaderDeadlineProtocol
from tests.support.servers import serve_app

WRITES: list[bytes] = []  # what reached the connection's real transport, write by write


class _Recorder:
    def __init__(self, transport: Any):
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class RecordingProtocol(HeaderDeadlineProtocol):
    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(_Recorder(transport))


async def whole(request):
    return JSONResponse({"answer": "ok", "n": int(request.query_params.get("n", 0))})


async def stream(request):
    async def events():
        for word in ("one ", "two ", "three"):
            yield f"data: {word}\n\n".encode()
            await asyncio.sleep(0.01)  # separate iterations: each event leaves when written

    return StreamingResponse(events(), media_type="text/event-stream")


APP = Starlette(routes=[Route("/whole", whole), Route("/stream", stream)])


def test_a_whole_answer_leaves_in_one_write_and_streams_and_closes_lose_nothing():
    WRITES.clear()
    with serve_app(APP, http=RecordingProtocol) as base, httpx.Client(base_url=base) as client:
        for n in range(3):  # one kept-alive connection: each answer is status line, headers and body in one write
            answer = client.get("/whole", params={"n": n})
            assert answer.json() == {"answer": "ok", "n": n}
        assert len(WRITES) == 3, [w[:40] for w in WRITES]
        assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b'"n":%d}' % i) for i, w in enumerate(WRITES))

        streamed = client.get("/stream")
        assert streamed.text == "data: one \n\ndata: two \n\ndata: three\n\n"

        # the server closes the connection right after the answer: what it held is written first
        closing = client.get("/whole", params={"n": 7}, headers={"connection": "close"})
        assert closing.json() == {"answer": "ok", "n": 7}
        assert closing.headers["connection"] == "close"
