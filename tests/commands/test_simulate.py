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
