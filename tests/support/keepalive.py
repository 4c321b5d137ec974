"""A loopback OpenAI-compatible upstream that answers the first request of each connection and keeps the
connection alive, then closes it on the next request without answering: what a server does when its idle timer
(uvicorn's keep-alive timeout, 5 s) fires as a pooled connection is handed a new request. Made deterministic here,
where under load it is a race."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-keepalive",
        "object": "chat.completion",
        "created": 0,
        "model": "keepalive",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()
CHUNK = json.dumps(
    {
        "id": "chatcmpl-keepalive",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "keepalive",
        "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
    }
).encode()
STREAM = b"data: " + CHUNK + b"\n\ndata: [DONE]\n\n"


class ClosingKeepAliveServer:
    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.dropped = 0  # requests a connection was closed on, unanswered
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    @staticmethod
    def _read_request(conn: socket.socket, buffered: bytes) -> tuple[bytes, bytes] | None:
        """(the request's body, what was read past it), or None when the client closed first."""
        while b"\r\n\r\n" not in buffered:
            part = conn.recv(65536)
            if not part:
                return None
            buffered += part
        head, _, rest = buffered.partition(b"\r\n\r\n")
        length = next(
            (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
            0,
        )
        while len(rest) < length:
            part = conn.recv(65536)
            if not part:
                return None
            rest += part
        return rest[:length], rest[length:]

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            buffered = b""
            answered = False
            try:
                while (request := self._read_request(conn, buffered)) is not None:
                    body, buffered = request
                    self.requests += 1
                    if answered:  # the idle timer fired: closed, nothing sent back
                        self.dropped += 1
                        return
                    stream = json.loads(body).get("stream")
                    content, kind = (STREAM, "text/event-stream") if stream else (COMPLETION, "application/json")
                    head = f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(content)}\r\n\r\n"
                    conn.sendall(head.encode() + content)
                    answered = True
            except OSError:
                pass


@contextmanager
def closing_keepalive_server():
    server = ClosingKeepAliveServer()
    server._threads[0].start()
    try:
        yield server
    finally:
        server._stop.set()
        for thread in server._threads:
            thread.join(timeout=5)
        server._sock.close()
