import csv
import json
from datetime import datetime

import pytest

from gateway.cli import main
from tests.support.ledger import sample_records, write_ledger


@pytest.fixture
def data_dir(tmp_path):
    write_ledger(tmp_path / "ledger.sqlite3", sample_records()).close()
    return tmp_path


def test_jsonl_export_round_trips_every_record(data_dir, tmp_path):
    out = tmp_path / "out.jsonl"
    assert main(["export", "--data-dir", str(data_dir), "--format", "jsonl", "-o", str(out)]) == 0
    items = [json.loads(line) for line in out.read_text().splitlines()]
    originals = {r.id: r for r in sample_records()}
    assert [i["id"] for i in items] == sorted(originals)
    for item in items:
        rec = originals[item["id"]]
        assert item["created_at"] == rec.created_at and item["route"] == rec.route and item["status"] == rec.status
        assert item["cost_usd"] == rec.cost_usd and item["counterfactual_cost_usd"] == rec.counterfactual_cost_usd
        assert item["context_tokens"] == rec.context_tokens and item["provenance"] == rec.provenance
        assert [(c["model"], c["prompt_tokens"], c["cost_usd"], c["error"]) for c in item["calls"]] == [
            (c.model, c.prompt_tokens, c.cost_usd, c.error) for c in rec.calls
        ]


def test_csv_export_round_trips_the_request_columns(data_dir, capsys):
    assert main(["export", "--data-dir", str(data_dir), "--format", "csv", "--since", "2026-01-02"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(captured.out.splitlines()))
    assert "exported 4 requests" in captured.err
    originals = {r.id: r for r in sample_records()}
    assert [row["id"] for row in rows] == ["r07", "r08", "r09", "r10"]
    for row in rows:
        rec = originals[row["id"]]
        assert datetime.fromisoformat(row["created_at"]).timestamp() == pytest.approx(rec.created_at, abs=1e-3)
        assert row["created_at"].endswith("Z") and "provenance" not in row
        assert float(row["cost_usd"]) == rec.cost_usd
        assert int(row["prompt_tokens"]) == rec.prompt_tokens
        assert row["route"] == (rec.route or "")
        assert row["models"] == "+".join(c.model for c in rec.calls) and int(row["legs"]) == len(rec.calls)
    assert rows[3]["route"] == "" and rows[3]["reason"] == ""


def test_export_honours_filters(data_dir, capsys):
    assert main(["export", "--data-dir", str(data_dir), "--route", "long"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["r03", "r07"]


def test_csv_provenance_only_on_request(data_dir, capsys):
    with_provenance = [r for r in sample_records() if r.provenance]
    assert with_provenance, "the sample ledger needs a request with provenance"
    assert main(["export", "--data-dir", str(data_dir), "--format", "csv", "--with-provenance"]) == 0
    rows = {row["id"]: row for row in csv.DictReader(capsys.readouterr().out.splitlines())}
    for rec in with_provenance:
        assert json.loads(rows[rec.id]["provenance"]) == rec.provenance
