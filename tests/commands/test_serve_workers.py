"""`selfroute serve` as a real subprocess: graceful shutdown on SIGTERM within its timeout, with in-flight
work cancelled and ledgered; several workers sharing the port and the ledger."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
POLICY = """
name: serve-test
aliases: [selfroute]
cheap: {{model: openai/fake-cheap, api_base: "{base}/v1", input_cost_per_mtok: 1.0, output_cost_per_mtok: 2.0,
         context_window: 8192}}
long: {{model: "openai/{long}", api_base: "{base}/v1", timeout: 300, input_cost_per_mtok: 10.0,
        output_cost_per_mtok: 20.0, context_window: 128000}}
routing: {{classifier: null, default_route: long}}
passthrough: {{allow: ["*"]}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path: Path, base: str, long: str, *extra: str) -> tuple[subprocess.Popen, str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(base=base, long=long))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--policy",
            str(policy),
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
            "--log-level",
            "WARNING",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    ready_in_a_row = 0
    # models load after the port opens; each worker says so on its own readiness probe, and a fresh connection
    # reaches either worker: ready once many probes in a row say so
    while ready_in_a_row < 20:
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the gateway did not become ready"
        try:
            ok = httpx.get(f"{url}/health/readiness", timeout=5).status_code == 200
        except httpx.HTTPError:
            ok = False
        ready_in_a_row = ready_in_a_row + 1 if ok else 0
        if not ok:
            time.sleep(0.2)
    return process, url


def ledger(tmp_path: Path) -> list[dict]:
    conn = sqlite3.connect(tmp_path / "data" / "ledger.sqlite3")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY created_at")]
    finally:
        conn.close()


def ask(url: str, text: str, timeout: float = 120) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        timeout=timeout,
        json={"model": "selfroute", "messages": [{"role": "user", "content": text}]},
    )


def test_sigterm_stops_within_the_shutdown_timeout_cancelling_and_ledgering_in_flight_work(upstream, tmp_path):
    base, fake = upstream
    process, url = serve(tmp_path, base, "sleep-120", "--shutdown-timeout", "2")
    outcome: list = []

    def blocked() -> None:
        try:
            outcome.append(ask(url, "A question the upstream takes two minutes to answer.").status_code)
        except httpx.HTTPError as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not any(r["body"]["model"] == "sleep-120" for r in fake.state.received):
        assert time.monotonic() < deadline, "the request never reached the upstream"
        time.sleep(0.05)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=90)
    took = time.monotonic() - started
    # uvicorn re-raises the signal it handled once it has shut down cleanly, as a process killed by it would
    assert process.returncode in (0, -signal.SIGTERM), output[-3000:]
    assert "Waiting for" in output or "graceful shutdown exceeded" in output
    assert took < 60, f"took {took:.1f} s to exit"  # bounded by the timeout, not by the upstream's two minutes
    thread.join(10)
    assert outcome and outcome[0] != 200
    rows = ledger(tmp_path)
    assert [r["status"] for r in rows] == [503] and "shut down" in rows[0]["error"]


def test_two_workers_share_the_port_and_the_ledger(upstream, tmp_path):
    base, _ = upstream
    process, url = serve(tmp_path, base, "fake-long", "--workers", "2")
    try:
        children = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == process.pid]
        assert len(children) >= 2, "two worker processes"
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda i: ask(url, f"Question {i}?"), range(40)))
        assert [a.status_code for a in answers] == [200] * 40
        assert all(a.json()["choices"][0]["message"]["content"].startswith("echo: Question") for a in answers)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=90)
    assert process.returncode in (0, -signal.SIGTERM), output[-3000:]
    rows = ledger(tmp_path)  # each worker's writer flushed into the one SQLite file on the way out
    assert len(rows) == 40 and {r["status"] for r in rows} == {200}
    assert len({r["id"] for r in rows}) == 40


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
