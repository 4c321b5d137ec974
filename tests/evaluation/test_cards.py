"""The model cards' generated parts: coverage, limitations and the threshold curve come from the run's figures."""

from gateway.evaluation.cards import (
    coverage_sentence,
    curve_card,
    documents_available,
    route_model_limitations,
    verifier_limitations,
)


def _unit(points, auc, escalated=0.0):
    return {"verifier_vs_random_points_at_25": points, "gain_auc": auc, "at_threshold": {"escalated": escalated}}


def test_documents_available_counts_the_text_files_of_each_folder(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.txt", "b.txt", "notes.md"):
        (docs / name).write_text("x")
    assert documents_available([("alpha", docs), ("beta", None), ("gamma", tmp_path / "missing")]) == {"alpha": 2}


def test_coverage_names_only_the_corpora_trained_on_part_of_their_folder():
    corpora = {
        "alpha": {"documents": 38, "documents_available": 67},
        "beta": {"documents": 5, "documents_available": 5},
        "gamma": {"documents": 3},
    }
    assert (
        coverage_sentence(corpora)
        == " Trained on part of a corpus only: alpha on 38 of the 67 documents in its folder."
    )
    assert coverage_sentence({"beta": corpora["beta"]}) == ""


def test_route_model_limitations_from_held_out_figures():
    held = {
        "protocol": "leave one corpus out",
        "units": {
            "alpha": {"roc_auc": 0.534, "accuracy": 0.84, "majority_accuracy": 0.90},
            "beta": {"roc_auc": 0.71, "accuracy": 0.80, "majority_accuracy": 0.70},
        },
    }
    text = route_model_limitations({"roc_auc": 0.695}, held, {"alpha": {"documents": 2, "documents_available": 3}})
    assert text.startswith("Measured leave one corpus out: ROC AUC 0.534 with alpha held out, 0.710 with beta held out")
    assert "(0.695 grouped by document, in distribution)" in text
    assert "barely transfer to alpha (" in text and "beta (" not in text.split("barely")[1].split(".")[0]
    assert "below always predicting the majority label on alpha:" in text
    assert text.endswith("alpha on 2 of the 3 documents in its folder.")
    held["units"]["alpha"] = {"roc_auc": 0.8, "accuracy": 0.95, "majority_accuracy": 0.9}
    text = route_model_limitations({"roc_auc": 0.695}, held, {})
    assert "barely" not in text and "majority" not in text
    assert route_model_limitations({"roc_auc": 0.7}, None, {}).startswith("Not measured on held-out corpora")


def test_verifier_limitations_name_the_units_short_of_the_targets():
    units = {"lara": _unit(0.18, 0.531), "leval": _unit(-0.66, 0.426), "other": _unit(2.5, 0.7)}
    router = {
        "lara": {"vs_better_baseline_points": -0.25, "beats_self_route": 1.0},
        "leval": {"vs_better_baseline_points": -4.68, "beats_self_route": 0.0},
    }
    text = verifier_limitations("leave one corpus out", units, 0.0, 0.2837, router, {})
    assert "+0.18 points with lara held out, -0.66 points with leval held out" in text
    assert "Short of the +2-point target on lara, leval (met on other)." in text
    assert "Below random escalation on leval:" in text
    assert (
        "At its threshold (0.0000) it escalates nothing on its own score; a refusal escalates when its P(good) is "
        "below 0.2837." in text
    )
    assert "better of always-long and always-RAG on leval (-4.68)." in text and "lara (-0.25)" not in text
    assert "does not beat Self-Route at no more tokens on leval." in text and "selfroute learn" in text
    good = verifier_limitations("leave one corpus out", {"a": _unit(3.0, 0.7, 0.12)}, 0.4, None, None, {})
    assert "target is met on every held-out unit" in good and "escalates 12.0% of a." in good
    assert "selfroute learn" not in good and "Below random" not in good


def test_curve_card_keeps_the_best_point_within_each_share():
    curve = [
        {"quality": 0.50, "vs_long_points": -5.0, "escalated": 0.0, "tokens_vs_long": 0.05, "cost_vs_long": 0.02},
        {"quality": 0.52, "vs_long_points": -3.0, "escalated": 0.2, "tokens_vs_long": 0.25, "cost_vs_long": 0.15},
        {"quality": 0.55, "vs_long_points": 0.0, "escalated": 0.9, "tokens_vs_long": 0.95, "cost_vs_long": 0.9},
    ]
    card = curve_card(curve)
    assert card["tokens_vs_long"]["0.1"] == {"vs_long_points": -5.0, "escalated": 0.0}
    assert card["tokens_vs_long"]["0.3"]["vs_long_points"] == -3.0 and card["cost_vs_long"]["0.2"]["escalated"] == 0.2
    assert card["tokens_vs_long"]["1"]["vs_long_points"] == 0.0
    assert curve_card(curve[2:])["tokens_vs_long"]["0.5"] is None
