"""`selfroute collections list|show|delete` on a real LanceDB store holding the packaged sample."""

from __future__ import annotations

import json

import pytest

from gateway.cli import main


@pytest.fixture
def data_dir(tmp_path, capsys):
    assert main(["ingest", "--sample", "--no-progress", "--data-dir", str(tmp_path)]) == 0
    assert main(["ingest", "notes", "--no-progress", "--data-dir", str(tmp_path), str(_note(tmp_path))]) == 0
    capsys.readouterr()
    return tmp_path


def _note(tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("The harbour office opens at nine.")
    return note


def test_list_show_delete(data_dir, capsys):
    assert main(["collections", "list", "--data-dir", str(data_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "documents", "chunks", "tokens"]
    assert [line.split()[:2] for line in lines[1:]] == [["harbour", "3"], ["notes", "1"]]

    assert main(["--data-dir", str(data_dir), "collections", "show", "harbour", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["name"] == "harbour" and info["document_count"] == 3
    assert "Article 9. Governing law and disputes" in info["documents"][0]["sections"]

    assert main(["collections", "show", "harbour", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("harbour: 3 documents") and "berth-lease.md" in out

    assert main(["collections", "delete", "harbour", "--data-dir", str(data_dir)]) == 0
    assert capsys.readouterr().out.startswith("deleted harbour: 3 documents")
    assert main(["collections", "list", "--json", "--data-dir", str(data_dir)]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)] == ["notes"]


def test_unknown_and_invalid_names(data_dir, capsys):
    assert main(["collections", "show", "nope", "--data-dir", str(data_dir)]) == 1
    assert "'nope' does not exist" in capsys.readouterr().err
    assert main(["collections", "delete", "bad name!", "--data-dir", str(data_dir)]) == 2
    assert "invalid collection name" in capsys.readouterr().err
