"""`selfroute explain`: the explain endpoint's decision from the command line, in-process, on a collection or files."""

from __future__ import annotations

import json

import pytest

from gateway.cli import main
from pipelines.samples import sample_path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain")
    assert main(["ingest", "--sample", "--no-progress", "--data-dir", str(path)]) == 0
    return path


def test_explain_on_a_collection(data_dir, capsys):
    capsys.readouterr()
    question = "Which court decides disputes under the berth lease?"
    assert main(["explain", question, "--collection", "harbour", "--data-dir", str(data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["object"] == "route.explanation" and result["question"] == question
    assert result["route"] in {"rag", "long"} and result["source"] == "collection"
    assert result["features"]["n_documents"] == 3 and result["features"]["top_score"] is not None
    assert set(result["estimates"]) == {"direct", "rag", "long"}
    assert result["estimates"]["long"]["prompt_tokens"] > result["estimates"]["rag"]["prompt_tokens"]
    # in-process, nothing was sent before: the long route is never estimated warm
    long = result["estimates"]["long"]
    assert long["cache"] in {"cold", "not_cacheable"} and long["cost_usd"] == long["cost_usd_uncached"]

    assert main(["explain", question, "-c", "harbour", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"route: {result['route']}") and "prompt tokens" in out
    long_row = next(line for line in out.splitlines() if line.startswith("long "))
    assert long_row.endswith(long["cache"].replace("_", " "))


def test_explain_on_a_file_goes_direct_when_it_is_short(tmp_path, capsys):
    lease = sample_path() / "berth-lease.md"
    assert (
        main(["explain", "What is the governing law?", "--file", str(lease), "--data-dir", str(tmp_path), "--json"])
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["route"] == "direct" and result["rule"] == "short-context"
    assert result["context_tokens"] > 1000


def test_unknown_collection_and_missing_file(data_dir, tmp_path, capsys):
    assert main(["explain", "Why?", "-c", "nope", "--data-dir", str(data_dir)]) == 1
    assert "'nope' does not exist" in capsys.readouterr().err
    assert main(["explain", "Why?", "-f", str(tmp_path / "absent.txt"), "--data-dir", str(data_dir)]) == 2
    assert "no such file" in capsys.readouterr().err
