"""`selfroute serve --workers 2` as a real subprocess: /metrics adds up both workers (prometheus_client's
multiprocess mode), so repeated scrapes never see a counter go back; JSON access lines from every worker."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.support.gateway import ask
from tests.support.policies import write_policy
from tests.support.servers import serve_gateway


def requests_total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("selfroute_requests_total{")
    )


def test_two_workers_one_metrics_view_and_json_access_lines(upstream, tmp_path):
    base, _ = upstream
    policy = write_policy(
        tmp_path / "policy.yaml",
        base,
        name="serve-test",
        long={"model": "openai/fake-long", "timeout": 300, "context_window": 128000},
    )
    flags = ("--log-format", "json", "--log-level", "INFO")
    served = serve_gateway(tmp_path, policy, *flags, workers=2, env={"PROMETHEUS_MULTIPROC_DIR": None})
    url, output = served.url, served.lines
    try:
        scrapes: list[str] = []
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = pool.map(lambda i: ask(url, f"Question {i}?"), range(30))
            for _ in range(12):  # while the requests are answered, on fresh connections: either worker answers
                scrapes.append(httpx.get(f"{url}/metrics", timeout=30).text)
            assert [a.status_code for a in answers] == [200] * 30
        time.sleep(0.5)
        scrapes += [httpx.get(f"{url}/metrics", timeout=30).text for _ in range(8)]
    finally:
        served.stop()
    counts = [requests_total(text) for text in scrapes]
    assert counts == sorted(counts), counts  # monotonic: one sum over both workers, whichever answered
    assert counts[-8:] == [30.0] * 8
    last = scrapes[-1]
    assert "_created" not in last
    assert len(set(re.findall(r'process_resident_memory_bytes\{pid="(\d+)"\}', last))) == 2  # each live worker
    assert re.search(r'selfroute_build_info\{python="[^"]+",version="[^"]+"\} 1\.0', last)
    assert "selfroute_requests_in_flight 0.0" in last
    lines = [json.loads(line) for line in output if line.startswith("{")]
    chat = [line for line in lines if line.get("path") == "/v1/chat/completions"]
    assert len(chat) == 30 and {(line["status"], line["route"], line["alias"]) for line in chat} == {
        (200, "long", "selfroute")
    }
    assert all(line["request_id"].startswith("req_") and line["cost_usd"] > 0 for line in chat)
    assert not [
        line for line in output if line.strip() and not line.startswith("{") and not line.startswith("selfroute: ")
    ], "every log line is JSON"
