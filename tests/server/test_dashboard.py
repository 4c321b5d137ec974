"""The dashboard: its summary data, and the page in a real browser (uvicorn on a free port, headless Chromium,
the DOM its script rendered).

Set SELFROUTE_UPDATE_SCREENSHOT=1 to refresh gateway/server/static/dashboard.png (the README's screenshot).
"""

import os
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gateway.ledger import reports
from gateway.ledger.database import connect
from gateway.ledger.summary import bucket_for, percentiles, summary
from tests.support.ledger import (
    ADMIN_KEY,
    BASE,
    LONG,
    admin_app,
    call,
    record,
    sample_records,
    synthetic_records,
    write_ledger,
)
from tests.support.servers import serve_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless dashboard test needs Debian's chromium package: apt-get install -y chromium"
)
SCREENSHOT = Path(__file__).resolve().parents[2] / "gateway" / "server" / "static" / "dashboard.png"


def chromium(url: str, tmp_path: Path, *extra: str) -> str:
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=8000",
        *extra,
        url,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture
def conn(ledger_location, tmp_path):
    ledger = write_ledger(ledger_location, sample_records(), tmp_path)
    ledger.close()
    reader = reports.connect_reader(ledger.location)
    yield reader
    reader.close()


def test_summary_has_what_the_dashboard_draws(conn):
    now = BASE + 86400 + 5000
    s = summary(conn, window=2 * 86400, now=now, top=3)
    assert s["bucket"] == "hour"
    assert s["totals"]["requests"] == 10 and s["totals"]["errors"] == 2
    assert s["fallback"] == {"fallbacks": 2, "rag_attempts": 6, "rate": pytest.approx(2 / 6)}
    assert sum(sum(b["cost_usd"].values()) for b in s["series"]) == pytest.approx(0.1651)
    mix = {m["group"]: m for m in s["route_mix"]}
    assert mix["rag"]["share"] == pytest.approx(0.4) and mix["unknown"]["requests"] == 1
    assert [r["id"] for r in s["most_expensive"]][:2] in (["r04", "r09"], ["r09", "r04"])
    assert s["slowest"][0]["id"] == "r06"
    assert s["latency_ms"]["all"]["count"] == 10
    # from the recorded latencies: 3 150 350 400 420 | 1900 2100 2600 2900 5100
    assert s["latency_ms"]["all"]["p50"] == pytest.approx((420 + 1900) / 2)
    assert s["latency_ms"]["long"]["p99"] == pytest.approx(1900 + 0.99 * 200)  # 1900 and 2100
    assert {k["group"]: k["requests"] for k in s["keys"]} == {"k_alice": 8, "k_bob": 2}
    assert s["unpriced_models"] == [] and not any(m["unpriced"] for m in s["models"])
    day = summary(conn, window=3600, now=now)
    assert day["totals"]["requests"] == 2  # r09, r10
    week = summary(conn, window=7 * 86400, now=now)
    assert week["bucket"] == "6 hours" and len(week["series"]) == 29
    assert sum(sum(b["cost_usd"].values()) for b in week["series"]) == pytest.approx(0.1651)
    month = summary(conn, window=30 * 86400, now=now)
    assert month["bucket"] == "day" and month["series"][-1]["t"] == datetime.fromtimestamp(now, UTC).strftime(
        "%Y-%m-%d"
    )


def test_short_windows_get_minute_buckets(tmp_path):
    now = BASE + 3000
    ledger = write_ledger(
        tmp_path / "ledger.sqlite3",
        [
            record("a", BASE + 2000, "rag", [], latency=100.0),
            record("b", BASE + 2010, "rag", [], latency=300.0),
            record("c", BASE + 2900, "long", [], latency=200.0),
        ],
    )
    conn = reports.connect_reader(ledger.path)
    s = summary(conn, window=3600, now=now)
    assert (s["bucket"], s["bucket_s"]) == ("minute", 60) and len(s["series"]) == 61
    busy = {b["t"]: b["requests"] for b in s["series"] if sum(b["requests"].values())}
    assert busy == {"2026-01-01T00:33Z": {"rag": 2, "long": 0}, "2026-01-01T00:48Z": {"rag": 0, "long": 1}}
    assert [bucket_for(w)[1] for w in (3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)] == [
        "minute",
        "10 minutes",
        "hour",
        "6 hours",
        "day",
    ]


def test_percentiles_are_those_of_the_recorded_latencies(tmp_path):
    # one 305 s request: histogram buckets would have put its p50 anywhere in (300 s, 600 s]
    ledger = write_ledger(tmp_path / "ledger.sqlite3", [record("slow", BASE, "rag>long", [], latency=305_000.0)])
    conn = reports.connect_reader(ledger.path)
    latency = summary(conn, window=3600, now=BASE + 60)["latency_ms"]
    assert (
        latency["rag>long"]
        == latency["all"]
        == {"count": 1, "p50": 305_000.0, "p90": 305_000.0, "p95": 305_000.0, "p99": 305_000.0}
    )
    assert percentiles([1.0, 2.0, 3.0, 4.0]) == {
        "count": 4,
        "p50": 2.5,
        "p90": pytest.approx(3.7),
        "p95": pytest.approx(3.85),
        "p99": pytest.approx(3.97),
    }


def test_latency_histogram_follows_replaced_and_deleted_rows(tmp_path):
    ledger = write_ledger(tmp_path / "ledger.sqlite3", [record("a", BASE, "rag", [], latency=120.0)])
    ledger.submit(record("a", BASE, "rag", [], latency=4000.0))
    ledger.flush()
    conn = reports.connect_reader(ledger.path)
    rollup = (
        "SELECT b.upper_ms, h.requests FROM latency_rollup_hourly h JOIN latency_buckets b USING (bucket)"
        " WHERE h.route = 'rag' AND h.requests > 0"
    )
    assert [tuple(row) for row in conn.execute(rollup)] == [(4000.0, 1)]
    writer = connect(ledger.path)
    with writer:
        writer.execute("DELETE FROM requests WHERE id = 'a'")
    assert conn.execute(rollup).fetchall() == []


def test_empty_window_summary(tmp_path):
    ledger = write_ledger(tmp_path / "ledger.sqlite3", [])
    conn = reports.connect_reader(ledger.path)
    s = summary(conn, window=3600, now=BASE)
    assert s["totals"]["requests"] == 0 and s["route_mix"] == [] and s["fallback"]["rate"] is None
    assert s["latency_ms"]["all"] == {"count": 0, "p50": None, "p90": None, "p95": None, "p99": None}
    assert s["prompt_cache"] == {
        "routes": [],
        "total": {
            "group": None,
            "calls": 0,
            "cache_hits": 0,
            "hit_rate": None,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "cached_share": None,
            "cache_saving_usd": 0.0,
        },
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("dash") / "ledger.sqlite3"
    mystery = call("openai/mystery-model", "passthrough", 300, 40, 0.0)
    mystery.unpriced = True
    # within 23 hours: every request stays in the page's 24-hour window while the tests run
    traffic = synthetic_records(400, now=time.time(), span=23 * 3600, seed=3, cache_reads=0.7)
    ledger = write_ledger(
        path, [*traffic, record("unpriced-1", time.time() - 60, "passthrough", [mystery], context=300)]
    )
    with serve_app(admin_app(ledger)) as url:
        yield url
    ledger.close()


@needs_chromium
def test_dashboard_renders_routes_costs_and_tables(site, tmp_path):
    dom = chromium(f"{site}/dashboard?key={ADMIN_KEY}", tmp_path, "--dump-dom")
    assert 'data-state="ready"' in dom, dom[-3000:]
    for route in ("rag", "long", "rag&gt;long", "direct"):
        assert f'data-route="{route}"' in dom
    assert "Always-long would cost" in dom and "$" in dom
    assert "<svg" in dom and "<rect" in dom  # the spend chart was drawn
    assert dom.count('href="#request=') >= 10  # most expensive and slowest requests link to their detail
    assert LONG in dom
    assert "Prompt tokens saved" in dom and "(of the recorded latencies)" in dom
    for key in ("k_alice", "k_bob", "k_carol"):  # the per-key panel
        assert f'data-key="{key}"' in dom
    assert "Unpriced models" in dom and "openai/mystery-model</code> has no known price" in dom
    assert '<tr data-unpriced="yes"><td title="openai/mystery-model">' in dom
    # the prompt cache panel: per route, the calls that read the cache of the route's calls, as the summary says
    panel = httpx.get(
        f"{site}/v1/admin/summary", params={"window": "24h"}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ).json()["prompt_cache"]
    rows = {r["group"]: r for r in panel["routes"]}
    assert rows["long"]["cache_hits"] > 0 and rows["rag>long"]["cache_hits"] > 0 and rows["rag"]["cache_hits"] == 0
    for route, row in (*rows.items(), ("all", panel["total"])):
        cells = dom.split(f'data-cache-route="{route.replace(">", "&gt;")}"')[1].split("</tr>")[0]
        assert f"{row['cache_hits']} of {row['calls']}" in cells and f"{100 * row['cached_share']:.1f}%" in cells
    assert "Prompt cache saved" in dom and f"${panel['total']['cache_saving_usd']:.3f}" in dom


@needs_chromium
def test_request_detail_opens_from_its_link(site, tmp_path):
    dom = chromium(f"{site}/dashboard?key={ADMIN_KEY}#request=req-3-00000", tmp_path, "--dump-dom")
    assert "Upstream legs" in dom and "req-3-00000" in dom and "Provenance" in dom


@needs_chromium
def test_without_the_key_the_page_asks_for_it(site, tmp_path):
    dom = chromium(f"{site}/dashboard", tmp_path, "--dump-dom")
    assert 'data-state="needs-key"' in dom
    assert "missing API key" in dom


@needs_chromium
def test_screenshot(site, tmp_path):
    shot = tmp_path / "dashboard.png"
    chromium(f"{site}/dashboard?key={ADMIN_KEY}", tmp_path, f"--screenshot={shot}", "--window-size=1400,1640")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("SELFROUTE_UPDATE_SCREENSHOT"):
        shutil.copyfile(shot, SCREENSHOT)


def test_huge_windows_estimate_percentiles_from_the_histograms(tmp_path, monkeypatch):
    from gateway.ledger import summary as summary_module

    records = synthetic_records(300, now=BASE + 86400, seed=5)
    ledger = write_ledger(tmp_path / "ledger.sqlite3", records)
    conn = reports.connect_reader(ledger.path)
    exact = summary(conn, window=2 * 86400, now=BASE + 86400)
    assert exact["latency_source"] == "recorded"
    monkeypatch.setattr(summary_module, "RAW_LATENCY_LIMIT", 100)
    estimated = summary(conn, window=2 * 86400, now=BASE + 86400)
    assert estimated["latency_source"] == "histogram"
    assert estimated["latency_ms"]["all"]["count"] == exact["latency_ms"]["all"]["count"]
    edges = [row[0] for row in conn.execute("SELECT upper_ms FROM latency_buckets ORDER BY bucket")]
    for p in ("p50", "p90", "p99"):  # the estimate lies in the bucket that holds the true value
        true = exact["latency_ms"]["all"][p]
        upper = next(e for e in edges if e >= true)
        lower = max([0.0, *(e for e in edges if e < true)])
        assert lower <= estimated["latency_ms"]["all"][p] <= upper
