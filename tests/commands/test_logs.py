import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.cli import main
from tests.ledger_fixtures import BASE, CHEAP, LONG, call, record, sample_records, write_ledger

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path):
    write_ledger(tmp_path / "ledger.sqlite3", sample_records()).close()
    return tmp_path


def test_logs_table_shows_recent_requests_oldest_first(data_dir, capsys):
    assert main(["logs", "--data-dir", str(data_dir), "-n", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["time", "(UTC)", "alias", "route", "reason", "models", "tokens", "cost", "latency",
                                "status"]
    assert len(lines) == 4
    assert "2026-01-02 01:06:40" in lines[2] and "rag>long" in lines[2] and f"{CHEAP}+{LONG}" in lines[2]
    assert "21000/130" in lines[2] and "$0.041000" in lines[2] and "2900ms" in lines[2]
    assert lines[3].rstrip().endswith("400")


def test_logs_filters_and_json(data_dir, capsys):
    assert main(["logs", "--data-dir", str(data_dir), "--json", "--route", "long", "--since", "2026-01-01",
                 "--until", "2026-01-02"]) == 0
    items = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [i["id"] for i in items] == ["r03"] and items[0]["models"] == [LONG]
    assert main(["logs", "--data-dir", str(data_dir), "--json", "--status", "5xx", "--key", "k_bob"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["r06"]
    assert main(["logs", "--data-dir", str(data_dir), "--json", "--policy", "strict"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["r05", "r08"]


def test_logs_reports_bad_input_and_a_missing_ledger(data_dir, tmp_path, capsys):
    assert main(["logs", "--data-dir", str(data_dir), "--since", "the other day"]) == 2
    assert "cannot read time" in capsys.readouterr().err
    assert main(["logs", "--data-dir", str(tmp_path / "empty")]) == 1
    assert "no ledger at" in capsys.readouterr().err


def test_logs_follow_prints_requests_as_they_are_written(data_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "logs", "--data-dir", str(data_dir), "--follow",
                             "--json", "-n", "1", "--interval", "0.1", "--route", "long"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert json.loads(proc.stdout.readline())["id"] == "r07"  # the last matching request, then it waits
        ledger = write_ledger(data_dir / "ledger.sqlite3", [
            record("new-rag", time.time(), "rag", [call(CHEAP, "rag", 1, 1, 0.0)]),
            record("new-long", BASE, "long", [call(LONG, "long", 1, 1, 0.0)]),  # old created_at, written now
        ])
        ledger.close()
        assert json.loads(proc.stdout.readline())["id"] == "new-long"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
