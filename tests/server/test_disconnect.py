"""A client that leaves before its answer stops the work: the upstream call is cancelled and the request
is ledgered as 499, at once rather than when the upstream would have answered."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import DROP, make_policy

# the long model answers after 30 s
POLICY = {
    "cheap": {"context_window": DROP},
    "long": {"model": "openai/sleep-30", "timeout": 120, "context_window": DROP},
}


@pytest.mark.parametrize("model", ["selfroute", "openai/sleep-30"])
def test_client_leaving_a_non_streaming_request_is_ledgered_as_499_at_once(upstream, tmp_path, model):
    with running_gateway(tmp_path, make_policy(upstream[0], **POLICY)) as (url, app):
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


@pytest.mark.parametrize("stream", [False, True])
def test_a_finished_request_leaves_no_reference_cycles(upstream, tmp_path, stream):
    """Watching for the client must not leave garbage that only the cyclic collector frees (a cancelled
    watcher's CancelledError, its traceback and frames; tenacity's retry objects): under load, collecting
    it stalled the event loop for hundreds of milliseconds."""
    import asyncio
    import gc
    import threading

    with running_gateway(tmp_path, make_policy(upstream[0], **POLICY)) as (url, _app):
        for thread in threading.enumerate():  # the gateway freezes what it loaded once: not during the count
            if thread.name == "selfroute-gc-freeze":
                thread.join(timeout=120)
        body = {"model": "openai/fake-cheap", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=60) as client:
            client.post(f"{url}/v1/chat/completions", json=body).read()  # warm
            gc.collect()
            gc.disable()
            try:
                for _ in range(20):
                    response = client.post(f"{url}/v1/chat/completions", json=body)
                    assert response.status_code == 200
                time.sleep(0.5)  # watchers end once their answer is sent
                gc.set_debug(gc.DEBUG_SAVEALL)
                gc.collect()
                cancelled = [o for o in gc.garbage if isinstance(o, asyncio.CancelledError)]
                retrying = [o for o in gc.garbage if type(o).__name__ == "AsyncRetrying"]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
    assert cancelled == [] and retrying == []
