"""The dashboard summary on each engine: the sub-hour spend series (raw rows, bucketed by the dialect), recorded
latency percentiles, the unpriced models of the window and the provider prompt cache per route."""

import pytest

from gateway.ledger import reports
from gateway.ledger.summary import summary
from tests.support.ledger import BASE, CHEAP, LONG, cached, call, record, sample_records, write_ledger


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
        result["totals"]["cost_usd"]
    )
    [long_point] = [p for p in result["series"] if p["requests"].get("long")]
    assert long_point["start"] == (BASE + 3700) // 60 * 60 and long_point["cost_usd"]["long"] == pytest.approx(0.04)
    assert result["latency_source"] == "recorded" and result["latency_ms"]["all"]["count"] == 7
    assert result["latency_ms"]["long"]["p50"] == pytest.approx(2100)


def test_unpriced_models_of_the_window_are_listed_and_marked(conn):
    result = summary(conn, window=2 * 3600, now=BASE + 7401)
    assert result["unpriced_models"] == [
        {"model": "openai/mystery-model", "calls": 1, "prompt_tokens": 300, "completion_tokens": 40}
    ]
    assert {m["group"]: m["unpriced"] for m in result["models"]}["openai/mystery-model"] is True
    assert summary(conn, window=600, now=BASE + 9000)["unpriced_models"] == []  # before that window


def _long(tokens: int = 0, saving: float = 0.0):
    return cached(call(LONG, "long", 20000, 80, 0.04, 2000.0), tokens, saving)


def _rag(tokens: int = 0, saving: float = 0.0):
    return cached(call(CHEAP, "rag", 1000, 50, 0.001, 300.0), tokens, saving)


def test_prompt_cache_per_route_from_the_rollup_and_the_window_edge(ledger_location, tmp_path):
    """Whole hours come from cache_rollup_hourly, the window's first partial hour from the raw legs; a re-written
    request counts once, with its last figures; a cache write (negative saving) is no hit."""
    ledger = write_ledger(
        ledger_location,
        [
            record("old", BASE + 600, "long", [_long(19000, 0.0171)]),  # 00:10, before the 3-hour window
            record("e1", BASE + 2000, "long", [_long(15000, 0.0135)]),  # 00:33, the raw edge
            record("h1", BASE + 3700, "long", [_long(5000, 0.5)]),  # re-written below
            record("h2", BASE + 7300, "long", [_long(0, -0.005)]),  # the write that filled the cache
            record("h3", BASE + 7400, "rag>long", [_rag(), _long(10000, 0.009)]),
            record("h4", BASE + 9000, "rag", [_rag(500, 0.0000375)]),  # OpenAI's own prefix cache on a RAG prompt
            record("h5", BASE + 9100, "rag", [_rag()]),
            record("d1", BASE + 9200, "direct", [call(CHEAP, "direct", 50, 20, 0.0001)]),
        ],
        tmp_path,
    )
    ledger.submit(record("h1", BASE + 3700, "long", [_long(18000, 0.0162)]))
    ledger.flush()
    ledger.close()
    conn = reports.connect_reader(ledger.location)
    try:
        window = summary(conn, window=3 * 3600, now=BASE + 3 * 3600 + 1800)["prompt_cache"]
        hour = summary(conn, window=3600, now=BASE + 3 * 3600 + 1800)["prompt_cache"]  # from 02:30: h4, h5, d1
    finally:
        conn.close()
    assert window["routes"] == [
        {
            "group": "long",
            "calls": 3,
            "cache_hits": 2,
            "hit_rate": pytest.approx(2 / 3),
            "prompt_tokens": 60000,
            "cached_tokens": 33000,
            "cached_share": pytest.approx(0.55),
            "cache_saving_usd": pytest.approx(0.0247),
        },
        {
            "group": "rag>long",
            "calls": 2,
            "cache_hits": 1,
            "hit_rate": 0.5,
            "prompt_tokens": 21000,
            "cached_tokens": 10000,
            "cached_share": pytest.approx(10 / 21),
            "cache_saving_usd": pytest.approx(0.009),
        },
        {
            "group": "rag",
            "calls": 2,
            "cache_hits": 1,
            "hit_rate": 0.5,
            "prompt_tokens": 2000,
            "cached_tokens": 500,
            "cached_share": 0.25,
            "cache_saving_usd": pytest.approx(0.0000375),
        },
        {
            "group": "direct",
            "calls": 1,
            "cache_hits": 0,
            "hit_rate": 0.0,
            "prompt_tokens": 50,
            "cached_tokens": 0,
            "cached_share": 0.0,
            "cache_saving_usd": 0.0,
        },
    ]
    assert window["total"] == {
        "group": None,
        "calls": 8,
        "cache_hits": 4,
        "hit_rate": 0.5,
        "prompt_tokens": 83050,
        "cached_tokens": 43500,
        "cached_share": pytest.approx(43500 / 83050),
        "cache_saving_usd": pytest.approx(0.0337375),
    }
    assert [(r["group"], r["calls"], r["cache_hits"], r["cached_tokens"]) for r in hour["routes"]] == [
        ("rag", 2, 1, 500),
        ("direct", 1, 0, 0),
    ]
    assert hour["total"]["cache_saving_usd"] == pytest.approx(0.0000375)
