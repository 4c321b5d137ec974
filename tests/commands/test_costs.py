import json
from datetime import UTC

import pytest

from gateway.cli import main
from gateway.ledger.records import UpstreamCall
from tests.support.ledger import BASE, LONG, call, record, sample_records, write_ledger


@pytest.fixture
def data_dir(tmp_path):
    write_ledger(tmp_path / "ledger.sqlite3", sample_records()).close()
    return tmp_path


def test_costs_table_by_route_with_total(data_dir, capsys):
    assert main(["costs", "--data-dir", str(data_dir), "--by", "route"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "route",
        "requests",
        "prompt",
        "tok",
        "completion",
        "tok",
        "cost",
        "always-long",
        "saving",
        "saving",
        "%",
        "tok",
        "saved",
        "tok",
        "saved",
        "%",
    ]
    rag = next(line.split() for line in lines if line.startswith("rag "))
    # always-long would have sent 60,000 prompt tokens (three answered at 20,000) plus 20,000 for the failed one
    assert rag == ["rag", "4", "3,900", "150", "$0.0030", "$0.1230", "$0.1200", "97.6%", "76,100", "95.1%"]
    total = lines[-1].split()
    assert total[:2] == ["TOTAL", "10"] and total[4:7] == ["$0.1651", "$0.2833", "$0.1182"]


def test_costs_json_by_model_and_filters(data_dir, capsys):
    assert main(["costs", "--data-dir", str(data_dir), "--by", "model", "--json", "--route", "rag>long"]) == 0
    report = json.loads(capsys.readouterr().out)
    groups = {g["group"]: g for g in report["groups"]}
    assert groups[LONG]["calls"] == 2 and groups[LONG]["cost_usd"] == pytest.approx(0.08)
    assert report["total"]["requests"] == 2
    assert main(["costs", "--data-dir", str(data_dir), "--by", "day", "--json", "--since", "2026-01-02"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [g["group"] for g in report["groups"]] == ["2026-01-02"]
    assert report["groups"][0]["saving_usd"] == pytest.approx(0.121 - 0.082)


def test_costs_model_table_shows_calls_and_no_per_model_saving(data_dir, capsys):
    assert main(["costs", "--data-dir", str(data_dir), "--by", "model"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["model", "calls"]
    assert next(line.split() for line in lines if line.startswith(LONG))[1:] == [
        "4",
        "80,000",
        "320",
        "$0.1600",
        "-",
        "-",
        "-",
        "-",
        "-",
    ]


def test_costs_show_token_savings_at_zero_prices_and_mark_unpriced_models(tmp_path, capsys):
    records = [
        record("free", BASE, "rag", [call("local/smollm2-135m-instruct", "rag", 1000, 20, 0.0)], context=8000),
        record(
            "mystery",
            BASE + 1,
            "passthrough",
            [
                UpstreamCall(
                    model="openai/mystery-model",
                    route="passthrough",
                    prompt_tokens=300,
                    completion_tokens=40,
                    cost_usd=0.0,
                    unpriced=True,
                    created_at=BASE,
                )
            ],
            context=300,
        ),
    ]
    write_ledger(tmp_path / "ledger.sqlite3", records).close()
    assert main(["costs", "--data-dir", str(tmp_path), "--by", "route"]) == 0
    out = capsys.readouterr().out
    rag = next(line.split() for line in out.splitlines() if line.startswith("rag "))
    assert rag[-2:] == ["7,000", "87.5%"]  # at $0 the dollar saving says nothing; the tokens still do
    assert "unpriced: openai/mystery-model has no known price; its 1 calls (340 tokens) are counted at $0" in out
    # nothing is priced above $0: tokens saved come first and the $0 columns are left out, said so
    assert out.splitlines()[0].split() == [
        "route",
        "requests",
        "prompt",
        "tok",
        "completion",
        "tok",
        "tok",
        "saved",
        "tok",
        "saved",
        "%",
    ]
    assert "dollar columns left out" in out and "$0.0000" not in out
    assert main(["costs", "--data-dir", str(tmp_path), "--by", "model"]) == 0
    mystery = next(line.split() for line in capsys.readouterr().out.splitlines() if "mystery" in line)
    assert mystery[:3] == ["openai/mystery-model", "(unpriced)", "1"]
    assert main(["costs", "--data-dir", str(tmp_path), "--by", "model", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {g["group"]: g["unpriced"] for g in report["groups"]} == {
        "openai/mystery-model": True,
        "local/smollm2-135m-instruct": False,
    }


def test_costs_rejects_an_unknown_grouping(data_dir, capsys):
    with pytest.raises(SystemExit):
        main(["costs", "--data-dir", str(data_dir), "--by", "colour"])


def test_ledger_commands_read_a_postgres_ledger_by_flag_or_environment(postgres_url, tmp_path, capsys, monkeypatch):
    write_ledger(postgres_url, sample_records(), tmp_path).close()
    empty = str(tmp_path / "no-sqlite-here")  # the data directory is not where the ledger is
    assert main(["costs", "--data-dir", empty, "--ledger-url", postgres_url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total"]["requests"] == 10 and report["total"]["cost_usd"] == pytest.approx(0.1651)
    monkeypatch.setenv("SELFROUTE_LEDGER_URL", postgres_url)
    assert main(["logs", "--data-dir", empty, "--json", "--route", "long"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["r03", "r07"]
    assert main(["export", "--data-dir", empty, "--format", "jsonl"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 10
    closed = postgres_url.rsplit(":", 1)[0] + ":1/nothing"  # nothing listens on port 1
    assert main(["costs", "--ledger-url", closed]) == 1
    assert "cannot reach the ledger database" in capsys.readouterr().err


def test_a_malformed_ledger_url_is_reported_without_its_password(tmp_path, capsys):
    secret = "Hunter2Secret"
    for url in (f"postgresql://app:{secret[:7]} {secret[7:]}@127.0.0.1:1/db", f"postgresql://app:{secret}@[::1:1/db"):
        for command in ("costs", "logs", "export"):
            assert main([command, "--data-dir", str(tmp_path), "--ledger-url", url]) == 1
            err = capsys.readouterr().err
            assert err.startswith(f"selfroute {command}: cannot reach the ledger database"), err
            assert secret[:7] not in err and secret[7:] not in err, err


def test_costs_by_week_sums_the_days_of_each_iso_week(tmp_path, capsys):
    """Monday 2026-01-05 starts ISO week 2; the Sunday before it still belongs to week 1."""
    from datetime import datetime

    def at(day: str) -> float:
        return datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp() + 3600

    rows = [
        record(f"w{i}", at(day), "rag", [call(LONG, "rag", 10, 1, cost)])
        for i, (day, cost) in enumerate(
            [("2026-01-04", 0.5), ("2026-01-05", 0.25), ("2026-01-11", 0.125), ("2026-01-12", 1.0)]
        )
    ]
    write_ledger(tmp_path / "ledger.sqlite3", rows).close()
    assert main(["costs", "--data-dir", str(tmp_path), "--by", "week", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(g["group"], g["requests"], g["cost_usd"]) for g in report["groups"]] == [
        ("2026-W01", 1, 0.5),
        ("2026-W02", 2, 0.375),
        ("2026-W03", 1, 1.0),
    ]
    assert report["total"]["cost_usd"] == pytest.approx(1.875)
    assert main(["costs", "--data-dir", str(tmp_path), "--by", "week"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[0] == "week"


def test_costs_by_tag_counts_a_request_under_each_of_its_tags(ledger_location, tmp_path, capsys):
    """metadata.tags kept in the provenance, on SQLite and PostgreSQL; untagged requests are in no tag's group."""
    tagged = [("t1", ["team-a", "batch"], 0.5), ("t2", ["team-a"], 0.25), ("t3", None, 1.0), ("t4", ["batch"], 0.125)]
    rows = [
        record(
            rid,
            BASE + i,
            "rag",
            [call(LONG, "rag", 100, 10, cost)],
            provenance={"tags": tags} if tags else None,
            key="k_tags",
        )
        for i, (rid, tags, cost) in enumerate(tagged)
    ]
    write_ledger(ledger_location, rows, tmp_path).close()
    base = ["costs", "--data-dir", str(tmp_path), "--ledger-url", str(ledger_location), "--by", "tag"]
    assert main([*base, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {g["group"]: (g["requests"], g["cost_usd"]) for g in report["groups"]} == {
        "team-a": (2, 0.75),
        "batch": (2, 0.625),
    }
    assert report["total"]["requests"] == 4  # the total counts each request once
    assert main([*base, "--json", "--since", "2026-01-01T00:00:01"]) == 0
    later = json.loads(capsys.readouterr().out)
    assert {g["group"]: g["requests"] for g in later["groups"]} == {"team-a": 1, "batch": 1}
