"""`selfroute policy check` loads every file a policy names, and `serve` refuses such a policy in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

from gateway.cli import main
from gateway.routing.model_files import builtin_model_path
from tests.support.policies import DROP, Whole, model_route, write_policy


def write(path: Path, long: str, model_path: str, **overrides) -> Path:
    """A policy naming gpt-4o-mini, `long` and a classifier file `model_path` (nothing else of the test policy's)."""
    return write_policy(
        path,
        None,
        name=DROP,
        cheap=model_route("openai/gpt-4o-mini"),
        long=model_route(long),
        routing=Whole(classifier={"model_path": model_path}),
        passthrough=DROP,
        **overrides,
    )


def test_a_missing_classifier_file_is_an_error(tmp_path, capsys):
    policy = write(tmp_path / "p.yaml", "openai/gpt-4.1", "models/router.skops")
    assert main(["policy", "check", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "routing.classifier.model_path" in err and "router.skops: model file not found" in err


def test_a_classifier_beside_the_policy_is_loaded(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    shutil.copy(builtin_model_path(), tmp_path / "models" / "router.skops")
    policy = write(tmp_path / "p.yaml", "openai/gpt-4.1", "models/router.skops")
    assert main(["policy", "check", str(policy)]) == 0
    assert ": valid" in capsys.readouterr().out
    (tmp_path / "models" / "router.skops").write_bytes(b"not a skops file")
    assert main(["policy", "check", str(policy)]) == 2
    assert "routing.classifier.model_path" in capsys.readouterr().err


def test_a_missing_local_gguf_and_embedding_folder_are_errors(tmp_path, capsys):
    policy = write(
        tmp_path / "p.yaml",
        f"local/{tmp_path}/absent.gguf",
        "builtin:default",
        rag={"embedding_model": f"{tmp_path}/no-model"},
    )
    assert main(["policy", "check", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "long.model" in err and "absent.gguf: no such .gguf file" in err
    assert "rag.embedding_model" in err and "no-model: no such model folder" in err


def test_serve_with_a_bad_policy_prints_one_line(tmp_path, capsys):
    policy = write(tmp_path / "p.yaml", "openai/gpt-4.1", "missing.skops")
    assert main(["serve", "--policy", str(policy), "--data-dir", str(tmp_path / "data"), "--port", "0"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "invalid policy" in lines[0] and "missing.skops" in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out

    policy.write_text("cheap: {model: a}\nlong: {model: b, timeout: zero}\n")
    assert main(["serve", "--policy", str(policy), "--data-dir", str(tmp_path / "data")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "long.timeout" in lines[0]
