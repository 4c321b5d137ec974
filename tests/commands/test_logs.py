import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.cli import main
from tests.support.ledger import BASE, CHEAP, LONG, call, record, sample_records, write_ledger

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path):
    write_ledger(tmp_path / "ledger.sqlite3", sample_records()).close()
    return tmp_path


def test_logs_table_shows_recent_requests_oldest_first(data_dir, capsys):
    assert main(["logs", "--data-dir", str(data_dir), "-n", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "time",
        "(UTC)",
        "request",
        "id",
        "alias",
        "route",
        "models",
        "tokens",
        "cost",
        "latency",
        "status",
        "reason",
    ]
    assert len(lines) == 4
    assert "2026-01-02 01:06:40" in lines[2] and "rag>long" in lines[2] and f"{CHEAP}+{LONG}" in lines[2]
    assert "21000/130" in lines[2] and "$0.041000" in lines[2] and "2900ms" in lines[2] and " r09 " in lines[2]
    assert lines[3].split()[-2:] == ["400", "-"]  # status, then no reason


def test_logs_shows_the_whole_reason_and_the_clients_request_id(tmp_path, capsys):
    reason = "classifier: P(cheap)=0.71 >= 0.50 -> rag; verifier: P(good)=0.31 < 0.45, escalated to long"
    escalated = record(
        "r1", BASE, "rag>long", [call(CHEAP, "rag", 10, 2, 0.001), call(LONG, "long", 90, 5, 0.01)], reason=reason
    )
    escalated.client_request_id = "my-trace-42"
    write_ledger(tmp_path / "ledger.sqlite3", [escalated, record("r2", BASE + 1, "rag", [])]).close()
    assert main(["logs", "--data-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[2] == "my-trace-42" and lines[1].endswith(reason)  # never cut
    assert lines[2].split()[2] == "r2"  # no X-Request-Id: the gateway's own id


def test_answered_by_long_matches_escalations_and_route_long_hints_at_it(tmp_path, capsys):
    write_ledger(
        tmp_path / "ledger.sqlite3",
        [
            record("esc", BASE, "rag>long", [call(CHEAP, "rag", 1, 1, 0.0), call(LONG, "long", 1, 1, 0.0)]),
            record("rag", BASE + 1, "rag", [call(CHEAP, "rag", 1, 1, 0.0)]),
        ],
    ).close()
    assert main(["logs", "--data-dir", str(tmp_path), "--route", "long"]) == 0
    assert "--answered-by long" in capsys.readouterr().err
    assert main(["logs", "--data-dir", str(tmp_path), "--answered-by", "long", "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["esc"]
    assert main(["logs", "--data-dir", str(tmp_path), "--answered-by", "rag", "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["rag"]


def test_logs_show_prints_every_leg_the_reason_provenance_and_flags(tmp_path, capsys):
    reason = "rule long_docs: max_document_tokens >= 4000 -> long; " + "x" * 80
    flags = [{"document": "lease", "rules": ["override_phrase"]}]
    shown = record(
        "req_abc",
        BASE,
        "rag>long",
        [call(CHEAP, "rag", 1000, 50, 0.001, 300.0), call(LONG, "long", 20000, 80, 0.04, 2000.0)],
        reason=reason,
        counterfactual=0.04,
        context=20000,
        provenance={"units": [{"doc": "lease", "section": "4.2"}], "flags": flags},
    )
    shown.client_request_id = "retry-1"
    again = record("req_def", BASE + 5, "rag", [call(CHEAP, "rag", 10, 1, 0.0)])
    again.client_request_id = "retry-1"  # a client reused its id: both are shown, never merged
    write_ledger(tmp_path / "ledger.sqlite3", [shown, again]).close()
    assert main(["logs", "--data-dir", str(tmp_path), "show", "req_abc"]) == 0
    out = capsys.readouterr().out
    assert "request      retry-1" in out and "gateway id   req_abc" in out
    assert f"reason       {reason}" in out
    assert f"1. {CHEAP}  route rag  1000/50 tokens  $0.001000  300ms" in out
    assert f"2. {LONG}  route long  20000/80 tokens  $0.040000  2000ms" in out
    assert '"section": "4.2"' in out and '"override_phrase"' in out
    assert main(["logs", "--data-dir", str(tmp_path), "show", "retry-1", "--json"]) == 0
    items = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [i["id"] for i in items] == ["req_def", "req_abc"] and len(items[1]["calls"]) == 2
    assert main(["logs", "--data-dir", str(tmp_path), "show", "nope"]) == 1
    assert "no request with id 'nope'" in capsys.readouterr().err
    assert main(["logs", "--data-dir", str(tmp_path), "shw", "req_abc"]) == 2


def test_logs_filters_and_json(data_dir, capsys):
    assert (
        main(
            [
                "logs",
                "--data-dir",
                str(data_dir),
                "--json",
                "--route",
                "long",
                "--since",
                "2026-01-01",
                "--until",
                "2026-01-02",
            ]
        )
        == 0
    )
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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "logs",
            "--data-dir",
            str(data_dir),
            "--follow",
            "--json",
            "-n",
            "1",
            "--interval",
            "0.1",
            "--route",
            "long",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert json.loads(proc.stdout.readline())["id"] == "r07"  # the last matching request, then it waits
        ledger = write_ledger(
            data_dir / "ledger.sqlite3",
            [
                record("new-rag", time.time(), "rag", [call(CHEAP, "rag", 1, 1, 0.0)]),
                record("new-long", BASE, "long", [call(LONG, "long", 1, 1, 0.0)]),  # old created_at, written now
            ],
        )
        ledger.close()
        assert json.loads(proc.stdout.readline())["id"] == "new-long"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
