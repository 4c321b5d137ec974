"""Servers for tests: ASGI apps under a real uvicorn on 127.0.0.1, port 0 (serve_app), and `selfroute serve` as
a subprocess on a free port (ServeProcess, start_replica), each waited for until it is ready."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import httpx
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
def serve_app(app, *, startup_timeout: float = 180.0, wait_ready: bool = True, **options):
    """Yield the base URL (http://127.0.0.1:PORT) of a running server, for a gateway once it is ready (unless
    wait_ready is false); stop it afterwards. `options` go to uvicorn.Config (`http=`: a protocol class)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", access_log=False, lifespan="on", **options
    )
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


# ------------------------------------------------------------------------------ `selfroute serve` as a subprocess
ROOT = Path(__file__).resolve().parents[2]
REPLICA_ADMIN_KEY = "sk-admin-replicas"
REPLICA_USER_KEY = "sk-user-replicas"


class ServeProcess:
    """`selfroute serve ARGS` of this checkout as a real subprocess on a free port of 127.0.0.1.

    `env` adds to (or, with None, removes from) the test's environment. The process's output goes to `log` (a
    file) if given, else into `lines`, read by a thread so the pipe never fills."""

    def __init__(
        self, *args: str, env: dict[str, str | None] | None = None, log: Path | None = None, port: int | None = None
    ):
        from tests.support.engines import free_port

        port = port or free_port()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.lines: list[str] = []
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        for name, value in (env or {}).items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = value
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), *args]
        self._drain: threading.Thread | None = None
        if log is not None:
            with log.open("w") as out:
                self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
        else:
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, cwd=ROOT
            )
            stdout = self.process.stdout
            self._drain = threading.Thread(target=lambda: self.lines.extend(stdout or ()), daemon=True)
            self._drain.start()

    def output(self) -> str:
        return self.log.read_text() if self.log is not None else "".join(self.lines)

    def wait_ready(self, timeout: float = 240.0, in_a_row: int = 1) -> ServeProcess:
        """Until ready (see wait_ready); a process that never gets there is killed, not left behind."""
        try:
            wait_ready(self.process, self.url, self.output, timeout=timeout, in_a_row=in_a_row)
        except BaseException:
            self.process.kill()
            self.process.wait(30)
            raise
        return self

    def stop(self, timeout: float = 90.0) -> str:
        """SIGTERM (a graceful shutdown), wait for the exit, and return everything the process wrote."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # never leave it behind (its exit status then says it was killed)
            self.process.kill()
            self.process.wait(30)
        if self._drain is not None:
            self._drain.join(10)
        return self.output()


def wait_ready(
    process: subprocess.Popen,
    url: str,
    output: Path | Callable[[], str],
    *,
    timeout: float = 240.0,
    in_a_row: int = 1,
) -> None:
    """Until `url`'s readiness probe says 200 `in_a_row` times: models load after the port opens (a request before
    is a 503 not_ready), and with several workers a fresh connection reaches any of them, each ready on its own."""
    read = output.read_text if isinstance(output, Path) else output
    deadline = time.monotonic() + timeout
    ready = 0
    while ready < in_a_row:
        assert process.poll() is None, read()[-3000:]
        assert time.monotonic() < deadline, "the gateway did not become ready\n" + read()[-3000:]
        try:
            ok = httpx.get(f"{url}/health/readiness", timeout=5).status_code == 200
        except httpx.HTTPError:
            ok = False
        ready = ready + 1 if ok else 0
        if not ok:
            time.sleep(0.2)


def start_replica(
    tmp_path: Path,
    name: str,
    policy: Path,
    ledger_url: str,
    extra_env: dict[str, str] | None = None,
    flags: list[str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """A `selfroute serve` replica (its data in tmp_path/name, its log in tmp_path/name.log) with the replica keys;
    the ledger URL goes in $SELFROUTE_LEDGER_URL unless the flags name it (--ledger-url)."""
    flags = flags or []
    env: dict[str, str | None] = {
        "SELFROUTE_ADMIN_KEY": REPLICA_ADMIN_KEY,
        "SELFROUTE_API_KEYS": REPLICA_USER_KEY,
        "SELFROUTE_LEDGER_URL": None if "--ledger-url" in flags else ledger_url,
        **(extra_env or {}),
    }
    served = ServeProcess(
        "--data-dir", str(tmp_path / name), "--policy", str(policy), *flags, env=env, log=tmp_path / f"{name}.log"
    )
    return served.process, served.url


def serve_gateway(tmp_path: Path, policy: Path, *flags: str, workers: int = 1, env=None) -> ServeProcess:
    """`selfroute serve --policy POLICY --data-dir tmp_path/data [--workers N] FLAGS`, once it is ready: with
    several workers, once 20 readiness probes in a row (fresh connections, any worker) said so."""
    extra = ("--workers", str(workers)) if workers > 1 else ()
    served = ServeProcess("--policy", str(policy), "--data-dir", str(tmp_path / "data"), *extra, *flags, env=env)
    return served.wait_ready(in_a_row=20 if workers > 1 else 1)
