"""The dashboard summary on each engine: the sub-hour spend series (raw rows, bucketed by the dialect), recorded
latency percentiles and the unpriced models of the window."""
import pytest

from gateway.ledger import reports
from gateway.ledger.summary import summary
from tests.ledger_fixtures import BASE, call, record, sample_records, write_ledger


@pytest.fixture
def conn(ledger_location, tmp_path):
    mystery = call("openai/mystery-model", "direct", 300, 40, 0.0)
    mystery.unpriced = True
    first_day = [r for r in sample_records() if r.created_at < BASE + 86400]  # summaries run up to now
    records = [*first_day, record("u1", BASE + 7350, "direct", [mystery], context=300, latency=200)]
    ledger = write_ledger(ledger_location, records, tmp_path)
    ledger.close()
    reader = reports.connect_reader(ledger.location)
    yield reader
    reader.close()


def test_minute_series_sums_to_the_window_and_places_each_request(conn):
    now = BASE + 7401  # the window [BASE + 201, now] holds r01-r06 and u1
    result = summary(conn, window=2 * 3600, now=now)
    assert (result["bucket"], result["bucket_s"]) == ("minute", 60)
    assert result["totals"]["requests"] == 7
    assert sum(sum(point["requests"].values()) for point in result["series"]) == 7
    assert sum(sum(point["cost_usd"].values()) for point in result["series"]) == pytest.approx(
        result["totals"]["cost_usd"])
    [long_point] = [p for p in result["series"] if p["requests"].get("long")]
    assert long_point["start"] == (BASE + 3700) // 60 * 60 and long_point["cost_usd"]["long"] == pytest.approx(0.04)
    assert result["latency_source"] == "recorded" and result["latency_ms"]["all"]["count"] == 7
    assert result["latency_ms"]["long"]["p50"] == pytest.approx(2100)


def test_unpriced_models_of_the_window_are_listed_and_marked(conn):
    result = summary(conn, window=2 * 3600, now=BASE + 7401)
    assert result["unpriced_models"] == [{"model": "openai/mystery-model", "calls": 1, "prompt_tokens": 300,
                                          "completion_tokens": 40}]
    assert {m["group"]: m["unpriced"] for m in result["models"]}["openai/mystery-model"] is True
    assert summary(conn, window=600, now=BASE + 9000)["unpriced_models"] == []  # before that window
