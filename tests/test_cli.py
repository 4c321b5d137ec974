"""The command line itself (gateway/cli.py): global options in either place, --version, quiet pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import build_parser, main
from gateway.settings import package_version as version
from tests.support.ledger import BASE, call, record, sample_records, write_ledger

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def data_dir(tmp_path):
    write_ledger(tmp_path / "ledger.sqlite3", sample_records()).close()
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["--data-dir", "{d}", "--log-level", "WARNING", "logs", "--json"],
        ["logs", "--data-dir", "{d}", "--log-level", "WARNING", "--json"],
        ["--log-level", "WARNING", "logs", "--json", "--data-dir", "{d}"],
    ],
)
def test_global_options_before_or_after_the_subcommand(data_dir, capsys, argv):
    assert main([a.format(d=data_dir) for a in argv]) == 0
    ids = [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()]
    assert ids == [r.id for r in sample_records()]


def test_a_global_option_after_the_subcommand_wins_over_one_before():
    args = build_parser().parse_args(["--data-dir", "/a", "logs", "--data-dir", "/b"])
    assert args.data_dir == "/b" and args.log_level


def test_defaults_without_global_options():
    args = build_parser().parse_args(["logs"])
    assert args.data_dir is None and args.log_level


def test_nested_subcommands_take_global_options_too(tmp_path, capsys):
    assert main(["--log-level", "ERROR", "policy", "check", "--data-dir", str(tmp_path)]) == 0
    assert ": valid" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"selfroute {version()}" and out != "selfroute "
    assert version()[0].isdigit()


def test_closed_pipe_ends_quietly(tmp_path):
    # enough rows that the export is still writing when `head` has gone
    many = [
        record(
            f"r{i:05d}",
            BASE + i,
            "rag",
            [call("openai/gpt-4o-mini", "rag", 10, 5, 0.0)],
            provenance={"chunks": [{"doc": "a.txt", "chunk": n} for n in range(20)]},
        )
        for i in range(3000)
    ]
    write_ledger(tmp_path / "ledger.sqlite3", many).close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = f"{sys.executable} -m gateway.cli export --data-dir {tmp_path} --format jsonl | head -n 2"
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, env=env, timeout=120
    )
    assert len(result.stdout.splitlines()) == 2
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == 141


def test_the_operators_commands_show_examples_in_their_help(capsys):
    import pytest as _pytest

    from gateway.cli import main as cli_main

    for argv in (
        ["serve"],
        ["policy", "check"],
        ["keys"],
        ["keys", "create"],
        ["keys", "edit"],
        ["keys", "rotate"],
        ["costs"],
        ["collections"],
        ["ingest"],
        ["explain"],
    ):
        with _pytest.raises(SystemExit):
            cli_main([*argv, "--help"])
        out = capsys.readouterr().out
        assert "examples:\n  selfroute " + argv[0] in out, argv
