"""`selfroute serve` as a real subprocess: graceful shutdown on SIGTERM within its timeout, with in-flight
work cancelled and ledgered; several workers sharing the port and the ledger."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.support.gateway import ask
from tests.support.policies import write_policy
from tests.support.servers import ServeProcess, serve_gateway


def serve(tmp_path: Path, base: str, long: str, *extra: str, workers: int = 1) -> ServeProcess:
    """A ready `serve` on the test policy, its long route on the fake upstream's model `long`."""
    policy = write_policy(
        tmp_path / "policy.yaml",
        base,
        name="serve-test",
        long={"model": f"openai/{long}", "timeout": 300, "context_window": 128000},
    )
    return serve_gateway(tmp_path, policy, "--log-level", "WARNING", *extra, workers=workers)


def ledger(tmp_path: Path) -> list[dict]:
    conn = sqlite3.connect(tmp_path / "data" / "ledger.sqlite3")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY created_at")]
    finally:
        conn.close()


def test_sigterm_stops_within_the_shutdown_timeout_cancelling_and_ledgering_in_flight_work(upstream, tmp_path):
    base, fake = upstream
    served = serve(tmp_path, base, "sleep-120", "--shutdown-timeout", "2")
    process, url = served.process, served.url
    outcome: list = []

    def blocked() -> None:
        try:
            answer = ask(url, "A question the upstream takes two minutes to answer.")
            outcome.append((answer.status_code, answer.text))
        except httpx.HTTPError as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not any(r["body"]["model"] == "sleep-120" for r in fake.state.received):
        assert time.monotonic() < deadline, "the request never reached the upstream"
        time.sleep(0.05)
    started = time.monotonic()
    output = served.stop()
    took = time.monotonic() - started
    # uvicorn re-raises the signal it handled once it has shut down cleanly, as a process killed by it would
    assert process.returncode in (0, -signal.SIGTERM), output[-3000:]
    assert "Waiting for" in output or "graceful shutdown exceeded" in output
    assert took < 60, f"took {took:.1f} s to exit"  # bounded by the timeout, not by the upstream's two minutes
    thread.join(10)
    # the client is told, in OpenAI's envelope (before: uvicorn's plain-text 500 "Internal Server Error")
    assert outcome and outcome[0][0] == 503, outcome
    assert json.loads(outcome[0][1])["error"]["code"] == "shutting_down"
    rows = ledger(tmp_path)
    assert [r["status"] for r in rows] == [503] and "shut down" in rows[0]["error"]


def test_a_stream_cut_by_the_shutdown_ends_with_an_error_event_and_is_ledgered_as_503(upstream, tmp_path):
    """probe11: a stream still open at the end of the grace period ended with a cut body (no error event, no [DONE])
    and was ledgered as 499, the client's fault, with a traceback in the log. Now as a non-stream request: 503
    shutting_down, told in the stream."""
    base, fake = upstream
    served = serve(tmp_path, base, "fake-dribble", "--shutdown-timeout", "1")
    process, url = served.process, served.url
    events: list[str] = []
    started = threading.Event()

    def streamed() -> None:
        body = {
            "model": "selfroute",
            "stream": True,
            "messages": [{"role": "user", "content": "Go on."}],
            "selfroute": {"route": "long"},
        }
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()

    thread = threading.Thread(target=streamed, daemon=True)
    thread.start()
    assert started.wait(60), "the stream never started"
    output = served.stop()  # 40 words at 0.25 s: the stream outlasts the 1 s grace
    assert process.returncode in (0, -signal.SIGTERM), output[-3000:]
    thread.join(10)
    assert events[-1] == "[DONE]", events[-3:]
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    assert len(events) < 40  # cut short
    assert "Exception in ASGI application" not in output, output[-3000:]
    rows = ledger(tmp_path)
    assert [(r["status"], r["error"]) for r in rows] == [(503, "the gateway shut down before the answer was ready")]


def test_two_workers_share_the_port_and_the_ledger(upstream, tmp_path):
    base, _ = upstream
    served = serve(tmp_path, base, "fake-long", workers=2)
    process, url = served.process, served.url
    try:
        children = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == process.pid]
        assert len(children) >= 2, "two worker processes"
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda i: ask(url, f"Question {i}?"), range(40)))
        assert [a.status_code for a in answers] == [200] * 40
        assert all(a.json()["choices"][0]["message"]["content"].startswith("echo: Question") for a in answers)
    finally:
        output = served.stop()
    assert process.returncode in (0, -signal.SIGTERM), output[-3000:]
    rows = ledger(tmp_path)  # each worker's writer flushed into the one SQLite file on the way out
    assert len(rows) == 40 and {r["status"] for r in rows} == {200}
    assert len({r["id"] for r in rows}) == 40


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
