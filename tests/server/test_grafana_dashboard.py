"""The Grafana dashboard shipped with the gateway asks only for metrics (and labels) that /metrics has."""

from __future__ import annotations

import json
import re
from importlib import resources

from gateway.server.metrics import GatewayMetrics
from tests.support.ledger import call, record, sample_records

# labels Prometheus adds at scrape time, or the histogram's and the multiprocess process_* own
SCRAPE_LABELS = {"job", "instance", "le", "pid"}
METRIC = re.compile(r"\b((?:selfroute|process)_[a-z_]+)\b")
GROUPED = re.compile(r"by \(([^)]*)\) \((?:rate|increase)?\(?((?:selfroute|process)_[a-z_]+)")


def dashboard() -> dict:
    return json.loads(resources.files("gateway.server").joinpath("static/grafana-dashboard.json").read_text())


def exprs() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def exposed() -> dict[str, set[str]]:
    """Every sample name /metrics has once requests were observed, with the labels it carries."""
    metrics = GatewayMetrics()
    for rec in sample_records():
        metrics.observe(rec)
    free = call("ollama/llama3", "passthrough", 10, 2, 0.0)
    free.unpriced = True  # a labelled counter has samples only once counted
    metrics.observe(record("unpriced", 0.0, "passthrough", [free]))
    metrics.time_to_first_token("rag", 0.3)
    names: dict[str, set[str]] = {}
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            names.setdefault(name, set()).update(re.findall(r'(\w+)="', line))
    return names


def test_every_query_names_a_metric_the_gateway_exposes():
    names = exposed()
    used = {name for expr in exprs() for name in METRIC.findall(expr)}
    assert len(used) >= 14
    assert sorted(used - set(names)) == []


def test_grouping_labels_exist_on_their_metrics():
    names = exposed()
    checked = 0
    for expr in exprs():
        for labels, name in GROUPED.findall(expr):
            wanted = {label.strip() for label in labels.split(",")}
            assert wanted <= names[name] | SCRAPE_LABELS, (expr, wanted - names[name])
            checked += 1
    assert checked >= 10


def test_the_dashboard_is_importable_grafana_json():
    board = dashboard()
    assert board["uid"] and board["title"] == "selfroute" and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "job"}
    assert all(
        target["datasource"]["uid"] == "${datasource}" for panel in board["panels"] for target in panel["targets"]
    )
