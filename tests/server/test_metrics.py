import re
from pathlib import Path

from starlette.testclient import TestClient

from gateway.server.metrics import GatewayMetrics
from tests.support.ledger import BASE, CHEAP, LONG, admin_app, call, record, sample_records, write_ledger


def sample(text: str, name: str, **labels) -> float:
    """The value of one sample in Prometheus text format (labels in any order)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(
            re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0] if "{" not in line else line[: line.rindex("}")])
        )
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{labels} in\n{text}")


def observed() -> str:
    metrics = GatewayMetrics()
    for rec in sample_records():
        metrics.observe(rec)
    return metrics.render().decode()


def test_counters_by_route_model_and_status():
    text = observed()
    assert sample(text, "selfroute_requests_total", route="rag", status="200") == 3
    assert sample(text, "selfroute_requests_total", route="rag", status="502") == 1
    assert sample(text, "selfroute_requests_total", route="unknown", status="400") == 1
    assert sample(text, "selfroute_tokens_total", route="long", model=LONG, kind="prompt") == 40000
    assert sample(text, "selfroute_tokens_total", route="rag>long", model=CHEAP, kind="completion") == 100
    assert abs(sample(text, "selfroute_cost_usd_total", route="rag>long", model=LONG) - 0.08) < 1e-9
    assert abs(sample(text, "selfroute_request_cost_usd_total", route="rag") - 0.003) < 1e-9
    assert abs(sample(text, "selfroute_counterfactual_cost_usd_total", route="rag") - 0.123) < 1e-9
    assert sample(text, "selfroute_upstream_calls_total", route="rag>long", model=CHEAP) == 2
    assert sample(text, "selfroute_fallbacks_total") == 2
    assert sample(text, "selfroute_upstream_errors_total", route="rag", model=CHEAP) == 1


def test_latency_histograms():
    text = observed()
    assert sample(text, "selfroute_request_latency_seconds_count", route="long") == 2
    assert abs(sample(text, "selfroute_request_latency_seconds_sum", route="long") - 4.0) < 1e-9
    assert sample(text, "selfroute_request_latency_seconds_bucket", route="long", le="2.5") == 2
    assert sample(text, "selfroute_request_latency_seconds_bucket", route="long", le="1.0") == 0
    assert sample(text, "selfroute_upstream_latency_seconds_count", route="rag>long", model=LONG) == 2


def test_metrics_endpoint_serves_prometheus_text_fed_by_the_ledger(tmp_path):
    metrics = GatewayMetrics()
    ledger = write_ledger(tmp_path / "ledger.sqlite3", [])
    ledger.subscribe(metrics.observe)
    for rec in sample_records():
        ledger.submit(rec)
    ledger.flush()
    with TestClient(admin_app(ledger, metrics=metrics)) as client:
        response = client.get("/metrics")
    ledger.close()
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert "# TYPE selfroute_requests_total counter" in response.text
    assert sample(response.text, "selfroute_requests_total", route="long", status="200") == 2


def test_separate_instances_do_not_share_counts():
    first, second = GatewayMetrics(), GatewayMetrics()
    first.observe(sample_records()[0])
    assert "selfroute_requests_total{" not in second.render().decode()


def model_labels(text: str) -> set[str]:
    return set(re.findall(r'model="([^"]*)"', text))


def test_model_label_values_are_capped_later_names_count_as_other():
    metrics = GatewayMetrics()
    # pass-through requests let clients pick any model name: each would be a new time series
    for n in range(100):
        metrics.observe(record(f"r{n}", BASE, "direct", [call(f"client-model-{n}", "direct", 10, 2, 0.001)]))
    metrics.observe(record("again", BASE, "direct", [call("client-model-3", "direct", 10, 2, 0.001)]))
    text = metrics.render().decode()
    assert model_labels(text) == {f"client-model-{n}" for n in range(64)} | {"other"}
    assert sample(text, "selfroute_upstream_calls_total", route="direct", model="client-model-3") == 2
    assert sample(text, "selfroute_upstream_calls_total", route="direct", model="other") == 36
    assert sample(text, "selfroute_tokens_total", route="direct", model="other", kind="prompt") == 360


def test_model_label_cap_is_configurable():
    metrics = GatewayMetrics(max_model_labels=1)
    for rec in sample_records():
        metrics.observe(rec)
    text = metrics.render().decode()
    assert model_labels(text) == {CHEAP, "other"}  # the cheap model is the first one seen
    assert sample(text, "selfroute_upstream_calls_total", route="long", model="other") == 2


def test_fallback_route_is_defined_once():
    from gateway.ledger import reports
    from gateway.server import metrics

    assert metrics.FALLBACK_ROUTE is reports.FALLBACK_ROUTE
    assert "FALLBACK_ROUTE =" not in Path(metrics.__file__).read_text()


def test_model_label_values_are_capped_in_length():
    from gateway.ledger.records import RequestRecord, UpstreamCall
    from gateway.server.metrics import MAX_LABEL_CHARS, GatewayMetrics

    metrics = GatewayMetrics()
    record = RequestRecord(
        id="r",
        created_at=0,
        key_id=None,
        policy=None,
        alias=None,
        route="passthrough",
        reason=None,
        status=200,
        calls=[UpstreamCall(model="m" * 10_000, route="passthrough")],
    )
    metrics.observe(record)
    text = metrics.render().decode()
    assert "m" * MAX_LABEL_CHARS in text and "m" * (MAX_LABEL_CHARS + 1) not in text


def test_no_created_series_and_process_build_in_flight_and_time_to_first_token():
    metrics = GatewayMetrics()
    for rec in sample_records():
        metrics.observe(rec)
    metrics.time_to_first_token("rag", 0.2)
    metrics.time_to_first_token(None, 3.0)
    text = metrics.render().decode()
    assert "_created" not in text
    assert sample(text, "process_resident_memory_bytes") > 0 and "process_cpu_seconds_total" in text
    import platform

    from gateway.settings import package_version

    assert sample(text, "selfroute_build_info", version=package_version(), python=platform.python_version()) == 1
    assert sample(text, "selfroute_requests_in_flight") == 0
    assert sample(text, "selfroute_time_to_first_token_seconds_count", route="rag") == 1
    assert sample(text, "selfroute_time_to_first_token_seconds_bucket", route="rag", le="0.25") == 1
    assert sample(text, "selfroute_time_to_first_token_seconds_bucket", route="unknown", le="2.5") == 0


def test_a_stream_is_timed_to_its_first_event_and_requests_in_flight_are_counted(upstream, tmp_path, monkeypatch):
    import threading

    import httpx

    from tests.support.gateway import running_gateway
    from tests.support.policies import make_policy

    base, _ = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")  # "dribble" is passed through to the fake upstream
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream-test")
    with running_gateway(tmp_path, make_policy(base)) as (url, _):
        seen_in_flight: list[float] = []
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            timeout=60,
            json={"model": "dribble", "stream": True, "messages": [{"role": "user", "content": "x"}]},
        ) as response:
            lines = response.iter_lines()
            next(lines)  # the stream is open: this request is in flight while /metrics is read
            seen_in_flight.append(sample(httpx.get(f"{url}/metrics").text, "selfroute_requests_in_flight"))
            for _ in lines:
                pass
        threading.Event().wait(0.2)  # observed once the response is done on the server
        text = httpx.get(f"{url}/metrics").text
    assert seen_in_flight == [1]  # the stream, not the scrape
    assert sample(text, "selfroute_requests_in_flight") == 0
    assert sample(text, "selfroute_time_to_first_token_seconds_count", route="passthrough") == 1
    # the first of 40 words a quarter of a second apart: well under the whole stream's ten seconds
    assert sample(text, "selfroute_time_to_first_token_seconds_sum", route="passthrough") < 5
