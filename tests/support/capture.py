"""A TCP listener on loopback that records every connection made to it and answers HTTP 500: stands in for
an attacker's server (must never be contacted) or for a provider's endpoint (to see what reached it)."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager


class CaptureServer:
    def __init__(self) -> None:
        self.connections: list[bytes] = []  # what each connection sent (headers and the start of the body)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        part = conn.recv(65536)
                        if not part:
                            break
                        data += part
                    conn.sendall(
                        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                        b"content-length: 2\r\nconnection: close\r\n\r\n{}"
                    )
                except OSError:
                    pass
                self.connections.append(data)

    def received(self, text: str) -> bool:
        return any(text.encode() in data for data in self.connections)


@contextmanager
def capture_server():
    server = CaptureServer()
    server._thread.start()
    try:
        yield server
    finally:
        server._stop.set()
        server._thread.join(timeout=5)
        server._sock.close()
