"""`selfroute eval replay --simulate-learning` on the tiny paired fixture (real MiniLM + LanceDB)."""

from __future__ import annotations

import json

from gateway.cli import main


def test_simulate_learning_reports_every_strategy_per_window(replay_run, capsys):
    args = [
        *replay_run["args"],
        "--simulate-learning",
        "--shadow-rate",
        "0.5",
        "--judge-noise",
        "0.2",
        "--refit-every",
        "4",
        "--sim-window",
        "5",
        "--sim-after",
        "5",
    ]
    assert main([*args, "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)["runs"]
    strategies = {"learning router", "shipped router (frozen)", "always-long", "always-RAG", "oracle"}
    assert set(run["trailing"]) == strategies and all(strategies <= set(w) for w in run["windows"])
    assert run["shadow_rate"] == 0.5 and run["questions"] == sum(w["always-long"]["questions"] for w in run["windows"])
    assert run["total"]["shipped router (frozen)"]["learning_cost_usd"] == 0
    assert set(run["targets"]) >= {"vs_frozen_points", "token_share_of_always_long"}
    assert main([*args, "--sim-seeds", "2", "--json"]) == 0  # two order seeds, features computed once
    seeded = json.loads(capsys.readouterr().out)
    assert [r["order_seed"] for r in seeded["runs"]] == seeded["seeds"] == [0, 1]
    [(part, summary)] = seeded["summary"].items()
    figures = [r["targets"]["vs_frozen_points"] for r in seeded["runs"]]
    assert summary["vs_frozen_points"]["mean"] == sum(figures) / 2 and summary["vs_frozen_points"]["max"] == max(
        figures
    )
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "after question 5" in out and "targets:" in out
    assert main([*args, "--shadow-rate", "0"]) == 2


def test_simulate_learning_from_held_out_models(replay_run, tmp_path, capsys):
    """--start-from held-out: every strategy starts from the protocol's out-of-fold models (corpus: fitted on the
    other corpus; model: on the other family, its documents' fold left out), not the shipped ones; a corpus's
    starting scores never read its own labels, so flipping them leaves what the frozen router escalates there."""
    from tests.support.routing import two_corpora

    data = two_corpora(tmp_path)
    base = ["eval", "replay", *data, *replay_run["args"][6:]]  # the fixture's options, on the two corpora's files
    args = [
        *base,
        "--simulate-learning",
        "--shadow-rate",
        "0.5",
        "--refit-every",
        "4",
        "--sim-window",
        "5",
        "--sim-after",
        "5",
        "--sim-split",
        "unit",
        "--json",
    ]
    for path in tmp_path.glob("*/paired.jsonl"):  # a field per corpus, to simulate each alone
        lines = [json.loads(line) | {"unit": path.parent.name} for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))

    def frozen(*extra):
        assert main([*args, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        return out, {r["part"]: r["total"]["shipped router (frozen)"] for r in out["runs"]}

    shipped_out, shipped = frozen()
    held_out, corpus = frozen("--start-from", "held-out", "--protocol", "corpus")
    assert held_out["start_from"] == "held-out" and held_out["protocol"] == "corpus"
    assert shipped_out["start_from"] == "shipped" and set(corpus) == set(shipped) == {"alpha", "beta"}
    assert corpus != shipped  # other scores, other decisions
    _, model = frozen("--start-from", "held-out", "--protocol", "model")
    assert model != corpus
    alpha = tmp_path / "alpha" / "paired.jsonl"
    lines = [json.loads(line) for line in alpha.read_text().splitlines()]
    alpha.write_text(
        "".join(json.dumps(r | {"rag_score": r["lc_score"], "lc_score": r["rag_score"]}) + "\n" for r in lines)
    )
    _, flipped = frozen("--start-from", "held-out", "--protocol", "corpus")
    assert flipped["alpha"]["escalated_share"] == corpus["alpha"]["escalated_share"]
    assert flipped["beta"] != corpus["beta"]  # beta's starting verifier was fitted on alpha's labels
    assert main([*args, "--start-from", "held-out"]) == 2  # the default protocol (grouped) is not held out
