"""Run ASGI apps under a real uvicorn on 127.0.0.1, port 0, and wait until they listen."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import uvicorn


def _wait_until_ready(app, deadline: float) -> None:
    """A gateway loads its models after it starts listening (its readiness probe says when): tests want them in."""
    startup = getattr(getattr(getattr(app, "state", None), "gateway", None), "startup", None)
    if startup is None:  # not a gateway, or one built without routing (the admin tests' apps)
        return
    while not startup.ready:
        if startup.error is not None:
            raise RuntimeError(f"gateway failed to load: {startup.error}")
        if time.monotonic() > deadline:
            raise TimeoutError("gateway did not load its models in time")
        time.sleep(0.01)


@contextmanager
def serve_app(app, *, startup_timeout: float = 180.0, wait_ready: bool = True):
    """Yield the base URL (http://127.0.0.1:PORT) of a running server, for a gateway once it is ready (unless
    wait_ready is false); stop it afterwards."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("server exited during start-up")
        if time.monotonic() > deadline:
            raise TimeoutError("server did not start in time")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        if wait_ready:
            _wait_until_ready(app, deadline)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
