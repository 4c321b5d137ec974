"""`selfroute eval live` against a real gateway and fake upstream, and the answer scorers."""

from __future__ import annotations

import json

import pytest

from gateway.cli import main
from gateway.evaluation.live import choice_letter, score_answer, token_f1


def test_scorers():
    assert token_f1("The Eiffel Tower", "eiffel tower") == 1.0
    assert token_f1("in Paris, France", "Paris") == pytest.approx(0.5)  # precision 1/3, recall 1
    assert token_f1("London", "Paris") == 0.0
    assert choice_letter("B. Rapid increase") == "B" and choice_letter("(c)") == "C"
    assert choice_letter("Because of data") is None
    assert choice_letter("The correct answer is:\n\n(C) Your children") == "C"
    assert choice_letter("The answer is: C) An upscale retreat.") == "C"
    assert choice_letter("A sample of owners") is None  # a sentence starting with "A" is not option A
    assert score_answer("The answer is: C) Yes", "(D) Yes, because the ruler says so")["score"] == 0.0
    assert score_answer("(D) yes", "(D) Yes, because the ruler says so")["score"] == 1.0
    assert score_answer("D. Valuation", "D")["score"] == 1.0
    assert score_answer("A", "D")["score"] == 0.0
    assert score_answer("the cat sat", "cat sat")["exact_match"] == 1.0


def test_eval_live_scores_answers_and_reads_the_ledger(tmp_path, capsys):
    from tests.support.fake_upstream import create_fake_upstream
    from tests.support.gateway import running_gateway
    from tests.support.policies import make_policy
    from tests.support.servers import serve_app

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "d1.txt").write_text("The pump is green. " * 20)
    data = tmp_path / "paired.jsonl"
    # the fake upstream echoes the question, so a gt equal to "echo: <query>" scores 1
    data.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"doc_id": "d1", "query": "What colour is the pump?", "gt": "echo: What colour is the pump?"},
                {"doc_id": "d1", "query": "Which one?", "gt": "C"},
            ]
        )
    )
    with serve_app(create_fake_upstream()) as upstream_url:
        policy = make_policy(upstream_url)  # no classifier, default route long
        with running_gateway(tmp_path / "data", policy) as (url, _):
            # a policy model by name is passed through untouched, so the echo is exactly the question
            assert (
                main(["eval", "live", "--data", str(data), "--base-url", url, "--model", "openai/fake-long", "--json"])
                == 0
            )
            first_run = json.loads(capsys.readouterr().out)
            assert main(["eval", "live", "--data", str(data), "--base-url", url, "--limit", "1", "--json"]) == 0
            routed = json.loads(capsys.readouterr().out)
    first, second = first_run["results"]
    assert first["score"] == 1.0 and first["route"] == "passthrough" and first["cost_usd"] > 0
    assert second["score"] == 0.0  # "echo: Which one?" is not option C
    assert first_run["summary"]["all"]["questions"] == 2
    assert first_run["summary"]["passthrough"]["mean_score"] == 0.5
    [result] = routed["results"]
    assert result["route"] == "long" and result["counterfactual_cost_usd"] > 0


def test_eval_live_closes_its_openai_client(tmp_path, monkeypatch, capsys):
    import openai
    from starlette.applications import Starlette

    from tests.support.servers import serve_app

    clients = []

    class RecordingOpenAI(openai.OpenAI):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            clients.append(self)

    monkeypatch.setattr(openai, "OpenAI", RecordingOpenAI)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d1.txt").write_text("The pump is green.")
    data = tmp_path / "paired.jsonl"
    data.write_text(json.dumps({"doc_id": "d1", "query": "What colour is the pump?", "gt": "green"}))
    with serve_app(Starlette()) as url:  # answers 404 to everything: the question fails, the run goes on
        assert main(["eval", "live", "--data", str(data), "--base-url", url, "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out)["results"]
    assert result["error"] and result["score"] == 0.0
    [client] = clients
    assert client.is_closed()
