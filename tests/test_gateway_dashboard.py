"""The dashboard in a real browser: uvicorn on a free port, headless Chromium, the DOM its script rendered.

Set SELFROUTE_UPDATE_SCREENSHOT=1 to refresh gateway/static/dashboard.png (the README's screenshot).
"""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.ledger_fixtures import ADMIN_KEY, LONG, admin_app, synthetic_records, write_ledger
from tests.servers import serve_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless dashboard test needs Debian's chromium "
                                                         "package: apt-get install -y chromium")
SCREENSHOT = Path(__file__).resolve().parents[1] / "gateway" / "static" / "dashboard.png"


def chromium(url: str, tmp_path: Path, *extra: str) -> str:
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=8000", *extra, url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("dash") / "ledger.sqlite3"
    ledger = write_ledger(path, synthetic_records(400, now=time.time(), seed=3))
    with serve_app(admin_app(ledger)) as url:
        yield url
    ledger.close()


def test_dashboard_renders_routes_costs_and_tables(site, tmp_path):
    dom = chromium(f"{site}/dashboard?key={ADMIN_KEY}", tmp_path, "--dump-dom")
    assert 'data-state="ready"' in dom, dom[-3000:]
    for route in ("rag", "long", "rag&gt;long", "direct"):
        assert f'data-route="{route}"' in dom
    assert "Always-long would cost" in dom and "$" in dom
    assert "<svg" in dom and "<rect" in dom  # the spend chart was drawn
    assert dom.count('href="#request=') >= 10  # most expensive and slowest requests link to their detail
    assert LONG in dom


def test_request_detail_opens_from_its_link(site, tmp_path):
    dom = chromium(f"{site}/dashboard?key={ADMIN_KEY}#request=req-3-00000", tmp_path, "--dump-dom")
    assert "Upstream legs" in dom and "req-3-00000" in dom and "Provenance" in dom


def test_without_the_key_the_page_asks_for_it(site, tmp_path):
    dom = chromium(f"{site}/dashboard", tmp_path, "--dump-dom")
    assert 'data-state="needs-key"' in dom
    assert "missing API key" in dom


def test_screenshot(site, tmp_path):
    shot = tmp_path / "dashboard.png"
    chromium(f"{site}/dashboard?key={ADMIN_KEY}", tmp_path, f"--screenshot={shot}", "--window-size=1400,1640")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("SELFROUTE_UPDATE_SCREENSHOT"):
        shutil.copyfile(shot, SCREENSHOT)
