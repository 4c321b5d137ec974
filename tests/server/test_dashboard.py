"""The dashboard: its summary data, and the page in a real browser (uvicorn on a free port, headless Chromium,
the DOM its script rendered).

Set SELFROUTE_UPDATE_SCREENSHOT=1 to refresh gateway/server/static/dashboard.png (the README's screenshot).
"""
import os
import shutil
import subprocess
import time
from pathlib import Path

from datetime import datetime, timezone

import pytest

from gateway.ledger import reports
from gateway.ledger.summary import histogram_percentiles, latency_histograms, summary
from gateway.ledger.database import connect
from tests.ledger_fixtures import (
    ADMIN_KEY, BASE, LONG, admin_app, record, sample_records, synthetic_records, write_ledger,
)
from tests.servers import serve_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless dashboard test needs Debian's chromium "
                                                         "package: apt-get install -y chromium")
SCREENSHOT = Path(__file__).resolve().parents[2] / "gateway" / "server" / "static" / "dashboard.png"


def chromium(url: str, tmp_path: Path, *extra: str) -> str:
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=8000", *extra, url]
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
    assert 400 < s["latency_ms"]["all"]["p50"] <= 500  # the exact median, 410, lies in the (400, 500] bucket
    assert 2000 < s["latency_ms"]["long"]["p99"] <= 2500  # 1900 and 2100
    day = summary(conn, window=3600, now=now)
    assert day["totals"]["requests"] == 2  # r09, r10
    week = summary(conn, window=7 * 86400, now=now)
    assert week["bucket"] == "day" and week["series"][-1]["t"] == datetime.fromtimestamp(now, timezone.utc).strftime(
        "%Y-%m-%d")




def test_histogram_percentiles_stay_inside_the_true_values_bucket(tmp_path):
    records = synthetic_records(500, now=BASE + 86400, seed=5)
    ledger = write_ledger(tmp_path / "ledger.sqlite3", records)
    conn = reports.connect_reader(ledger.path)
    since = BASE + 1234.5  # not on an hour: the first partial hour is read raw
    edges, counts = latency_histograms(conn, since)
    values = sorted(r.latency_ms for r in records if r.created_at >= since)
    merged = [sum(c) for c in zip(*counts.values())]
    assert sum(merged) == len(values)
    estimate = histogram_percentiles(edges, merged)
    for p in (50, 90, 99):
        true = values[max(0, -(-p * len(values) // 100) - 1)]
        upper = next(e for e in edges if e >= true)
        lower = max([0.0, *(e for e in edges if e < true)])
        assert lower <= estimate[f"p{p}"] <= upper, (p, true, estimate)


def test_latency_histogram_follows_replaced_and_deleted_rows(tmp_path):
    ledger = write_ledger(tmp_path / "ledger.sqlite3", [record("a", BASE, "rag", [], latency=120.0)])
    ledger.submit(record("a", BASE, "rag", [], latency=4000.0))
    ledger.flush()
    conn = reports.connect_reader(ledger.path)
    edges, counts = latency_histograms(conn, BASE - 3600)
    assert sum(counts["rag"]) == 1 and counts["rag"][edges.index(4000)] == 1
    writer = connect(ledger.path)
    with writer:
        writer.execute("DELETE FROM requests WHERE id = 'a'")
    assert sum(latency_histograms(conn, BASE - 3600)[1]["rag"]) == 0


def test_empty_window_summary(tmp_path):
    ledger = write_ledger(tmp_path / "ledger.sqlite3", [])
    conn = reports.connect_reader(ledger.path)
    s = summary(conn, window=3600, now=BASE)
    assert s["totals"]["requests"] == 0 and s["route_mix"] == [] and s["fallback"]["rate"] is None
    assert s["latency_ms"]["all"] == {"count": 0, "p50": None, "p90": None, "p95": None, "p99": None}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("dash") / "ledger.sqlite3"
    ledger = write_ledger(path, synthetic_records(400, now=time.time(), seed=3))
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
