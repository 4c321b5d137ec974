"""`selfroute learn`, `selfroute whatif` and `selfroute calibrate --from-ledger` on a small recorded ledger: routed
requests with their stored features, scores and labels (judge, shadow), written by the ledger's own writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from classifier.features import FEATURE_NAMES
from gateway.cli import main
from gateway.routing.model_files import load_route_model, load_verifier_model
from policies.loader import load_policy
from tests.support.ledger import recorded_ledger, relative_ledger
from tests.support.policies import DROP, Whole, model_route, write_policy
from tests.support.routing import write_paired_fixture


def learned_policy(
    path: Path,
    threshold: float,
    classifier_threshold: float | None = None,
    refusal_threshold: float = 1.0,
    relative: dict | None = None,
    shadow_backoff: dict | None = None,
) -> Path:
    """Both routes on the local model, the shipped verifier at `threshold` (refusals below `refusal_threshold`
    escalate; with `relative`, its routing.verifier.relative), the judge on (with `shadow_backoff`, its
    routing.learning.shadow_backoff); the shipped pre-route classifier at `classifier_threshold` if given, else none."""
    local = model_route("local/smollm2-135m-instruct", context_window=8192)
    classifier = None
    if classifier_threshold is not None:
        classifier = {"model_path": "builtin:default", "threshold": classifier_threshold}
    routing = Whole(
        classifier=classifier,
        default_route="rag",
        verifier={
            "model_path": "builtin:verifier",
            "threshold": threshold,
            "refusal_threshold": refusal_threshold,
            "threshold_source": "shipped",
            **({"relative": relative} if relative is not None else {}),
        },
        learning={
            "judge": True,
            "shadow_rate": 0.2,
            **({"shadow_backoff": shadow_backoff} if shadow_backoff is not None else {}),
        },
    )
    return write_policy(path, None, name="learned", cheap=local, long=local, routing=routing, passthrough=DROP)


@pytest.fixture()
def setup(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    threshold = recorded_ledger(ledger)
    policy = learned_policy(tmp_path / "policy.yaml", threshold)
    return policy, ledger


def test_learn_writes_a_better_verifier_and_keeps_the_old_one(setup, capsys):
    policy, ledger = setup
    before = policy.read_text()
    assert main(["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["labelled"] > 120 and report["gain_points"] > 5 and report["written"] is None
    assert policy.read_text() == before  # a dry run writes nothing
    # the fixture's ~120 labels are under the default minimum (200): a lower one lets the refit replace the verifier
    assert (
        main(["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--min-model-labels", "50", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    written = policy.parent / report["model_path"]
    assert written.is_file() and report["written"] == str(written)
    learned, _ = load_policy(policy)
    assert learned.routing.verifier.model_path == written.name
    assert learned.routing.verifier.threshold == pytest.approx(report["new_threshold"])
    assert "learn " in learned.routing.verifier.threshold_source and "learning:" in policy.read_text()
    verifier = load_verifier_model(learned, policy)  # the policy loads with the new model
    low, high = (
        {n: 0.0 for n in verifier.feature_names}
        | {"ans_support_passages": s, "ans_words": 12.0, "pre_route_probability": 0.8}
        for s in (0.1, 0.9)
    )
    assert verifier.score(low) > verifier.score(high)  # it learned this deployment's direction


def test_learn_keeps_the_verifier_below_its_minimum_of_labels(setup, capsys):
    """--min-model-labels above the ledger's labels: the refit wins out of fold, yet no new verifier is written."""
    policy, ledger = setup
    args = ["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--dry-run", "--json"]
    assert main([*args, "--min-model-labels", "100000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gain_points"] > 5 and report.get("model_path") is None
    assert "kept the verifier in force" in report["decision"] and "< 100000" in report["decision"]


def test_learn_by_default_changes_only_thresholds_below_200_labels(setup, capsys):
    """The default --min-model-labels (200): on the fixture's ~120 labels the refit wins out of fold by > 5 points,
    yet the verifier in force stays and only its thresholds are written (BENCHMARKS.md section 12: on ~60 labels a
    replacement cost 4-6 points on L-Eval)."""
    from gateway.evaluation.refit import MIN_MODEL_LABELS

    policy, ledger = setup
    assert MIN_MODEL_LABELS == 200
    args = ["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--json"]
    assert main([*args, "--escalation-share", "0.3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["labelled"] < MIN_MODEL_LABELS and report["gain_points"] > 5, report
    assert report.get("model_path") is None and f"< {MIN_MODEL_LABELS}" in report["decision"]
    assert not list(policy.parent.glob("verifier-learned-*"))
    learned, _ = load_policy(policy)
    assert learned.routing.verifier.model_path == "builtin:verifier"
    assert learned.routing.verifier.threshold == pytest.approx(report["new_threshold"])


def test_learn_rechooses_the_refusal_threshold(tmp_path, capsys):
    """Refusals the labels say are usually wrong, which the policy in force lets stand: learn's thresholds escalate
    them at the same escalation share (with the model in force or a refit, whichever wins; the thresholds-only path
    is tested in tests/evaluation/test_refit.py)."""
    ledger = tmp_path / "ledger.sqlite3"
    threshold = recorded_ledger(ledger, wrong_refusals=True)
    policy = learned_policy(tmp_path / "policy.yaml", threshold, refusal_threshold=0.0)  # as recorded
    args = ["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["quality_in_force"] > report["quality_recorded"] + 5, report
    assert report["new_refusal_threshold"] > 0.5
    learned, _ = load_policy(policy)
    assert learned.routing.verifier.refusal_threshold == pytest.approx(report["new_refusal_threshold"])
    assert learned.routing.verifier.threshold == pytest.approx(report["new_threshold"])
    if report["written"] is None:  # no refit won: the model in force stays, with new thresholds
        assert learned.routing.verifier.model_path == "builtin:verifier" and "new thresholds" in report["decision"]


def test_learn_refits_the_pre_route_classifier_with_enough_labels(tmp_path, capsys):
    ledger = tmp_path / "ledger.sqlite3"
    threshold = recorded_ledger(ledger, n=420, route_signal=True)
    policy = learned_policy(tmp_path / "policy.yaml", threshold, classifier_threshold=0.0)
    args = ["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--json"]
    assert main([*args, "--min-route-labels", "1000"]) == 0  # too few for the classifier: it stays
    report = json.loads(capsys.readouterr().out)
    assert "not refitted" in report["classifier"]["decision"] and "builtin:default" in policy.read_text()
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    part = report["classifier"]
    assert part["labelled"] >= 200 and part["gain_points"] > 5, part
    written = policy.parent / part["model_path"]
    assert written.is_file() and part["written"] == str(written)
    learned, _ = load_policy(policy)
    assert learned.routing.classifier.model_path == written.name
    assert learned.routing.classifier.threshold == pytest.approx(part["new_threshold"])
    model = load_route_model(learned, policy)  # the policy loads with the new model
    base = {name: 0.5 for name in FEATURE_NAMES}
    low, high = (model.cheap_probability(base | {"top_score": s}) for s in (0.1, 0.9))
    assert low > high  # it learned this deployment's direction
    assert load_route_model(load_policy(None)[0], None).source.endswith("default.skops")  # the shipped one stays


def test_learn_blends_the_shipped_training_data(setup, tmp_path, capsys):
    policy, ledger = setup
    paired, docs = write_paired_fixture(tmp_path / "shipped")
    lines = len(paired.read_text().splitlines())
    blend = ["--blend-shipped", str(paired), "--blend-docs", str(docs), "--data-dir", str(tmp_path / "data")]
    args = ["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--min-model-labels", "50", "--json"]
    assert main([*args, "--dry-run"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*args, *blend, "--blend-weight", "0.5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["blended"] == lines and report["quality_refit"] != alone["quality_refit"]
    assert report["blend_weighting"] == "0.5 x the ledger labels"
    card = json.loads((policy.parent / report["model_path"]).with_suffix(".json").read_text())
    assert f"blended with {lines} lines of paired.jsonl" in card["trained_on"]
    # --blend-prior: the shipped lines weigh as that many labels whatever the ledger holds
    assert main([*args, *blend, "--blend-prior", "1e6", "--dry-run"]) == 0
    strong = json.loads(capsys.readouterr().out)
    assert strong["quality_refit"] != report["quality_refit"] and strong["blend_weighting"] == "as 1e+06 labels"
    assert main([*args, *blend, "--dry-run"]) == 0  # the default: as 500 labels
    default = json.loads(capsys.readouterr().out)
    assert default["blend_weighting"] == "as 500 labels" and default["quality_refit"] != strong["quality_refit"]
    # escalation labels out of the fit (the judged escalations), still in the replay (the verifier written above in
    # force for both)
    assert main([*args, "--dry-run"]) == 0
    weighed = json.loads(capsys.readouterr().out)
    assert main([*args, "--escalation-label-weight", "0", "--dry-run"]) == 0
    unescalated = json.loads(capsys.readouterr().out)
    assert unescalated["quality_refit"] != weighed["quality_refit"]
    assert unescalated["quality_in_force"] == weighed["quality_in_force"]
    assert main([*args, "--blend-shipped", str(paired)]) == 2  # the documents are needed too
    assert "go together" in capsys.readouterr().err


def test_learn_keeps_the_model_without_enough_labels(tmp_path, capsys):
    policy = learned_policy(tmp_path / "policy.yaml", 0.5)
    recorded_ledger(tmp_path / "l.sqlite3", labelled=False)
    assert main(["learn", "--policy", str(policy), "--ledger-url", str(tmp_path / "l.sqlite3")]) == 0
    assert "not refitted: 0 labelled" in capsys.readouterr().out
    assert "builtin:verifier" in policy.read_text()


def test_whatif_recomputes_recorded_decisions_under_a_candidate(setup, capsys):
    policy, ledger = setup
    candidate = learned_policy(policy.parent / "never-escalate.yaml", 0.0)
    assert main(["whatif", "--policy", str(candidate), "--ledger-url", str(ledger), "--since", "7d", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    now, cand = out["in_force"], out["candidate"]
    assert now["requests"] == cand["requests"] == 240  # judge rows have no features: not routed requests
    assert now["routes"].get("rag>long", 0) > 0 and cand["routes"] == {"rag": 240}
    assert cand["cost_usd"] == pytest.approx(240 * 0.001) and cand["cost_usd"] < now["cost_usd"]
    assert cand["labelled"] == now["labelled"] > 0 and cand["quality"] < now["quality"]
    # the same policy as in force reproduces what was recorded
    assert main(["whatif", "--policy", str(policy), "--ledger-url", str(ledger), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)["candidate"]
    assert same["routes"] == now["routes"] and same["cost_usd"] == pytest.approx(now["cost_usd"])
    assert main(["whatif", "--policy", str(candidate), "--ledger-url", str(ledger)]) == 0
    assert "candidate" in capsys.readouterr().out


def test_calibrate_from_the_ledger_holds_a_cost_share(setup, capsys):
    policy, ledger = setup
    assert (
        main(
            [
                "calibrate",
                "--from-ledger",
                "--max-cost-share",
                "0.4",
                "--policy",
                str(policy),
                "--ledger-url",
                str(ledger),
            ]
        )
        == 0
    )
    assert "of always-long" in capsys.readouterr().out
    calibrated, _ = load_policy(policy)
    threshold = calibrated.routing.verifier.threshold
    assert "--from-ledger" in calibrated.routing.verifier.threshold_source
    assert main(["whatif", "--policy", str(policy), "--ledger-url", str(ledger), "--json"]) == 0
    share = json.loads(capsys.readouterr().out)["candidate"]["cost_share"]
    assert 0.3 < share <= 0.4 + 1e-9 and threshold > 0  # as many escalations as the share allows
    assert main(["calibrate", "--from-ledger", "--policy", str(policy), "--target-long-share", "0.2"]) == 2


def test_a_shadow_label_weighs_one_over_the_chance_its_request_was_shadowed():
    """learn weighs each shadow label by the live rule's chance from the request's recorded context tokens
    (gateway.routing.learning.loop.shadow_probability); judge labels of escalations and feedback weigh 1."""
    from types import SimpleNamespace

    from gateway.commands.learn import _weights
    from policies.schema import LearningSettings

    def request(source, tokens):
        return SimpleNamespace(labels=[{"source": source}], features={"features": {"context_tokens": tokens}})

    requests = [request("shadow", 4_000), request("shadow", 64_000), request("judge", 64_000), request("feedback", 1)]
    tied = LearningSettings(judge=True, shadow_rate=0.05, shadow_reference_tokens=16_000)
    assert _weights(requests, tied) == pytest.approx([20.0, 80.0, 1.0, 1.0])
    assert _weights(requests, LearningSettings(judge=True, shadow_rate=0.05)) == pytest.approx([20.0, 20.0, 1.0, 1.0])


def test_learn_moves_the_shadow_scale_with_its_refit(tmp_path, capsys):
    """routing.learning.shadow_backoff: a refit that beats the verifier in force out of fold doubles the scale in
    force (a dry run writes nothing); once that refit is in force, the next on the same labels has nothing to win and
    halves it again."""
    ledger = tmp_path / "ledger.sqlite3"
    backoff = {"factor": 0.5, "min_scale": 0.1, "scale": 0.5}
    policy = learned_policy(tmp_path / "policy.yaml", recorded_ledger(ledger), shadow_backoff=backoff)
    args = ["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--min-model-labels", "50", "--json"]
    assert main([*args, "--dry-run"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shadow_backoff"] | {"decision": None} == {
        "won": True,
        "scale_in_force": 0.5,
        "scale": 1.0,
        "shadow_rate_now": 0.2,
        "decision": None,
    }
    assert load_policy(policy)[0].routing.learning.shadow_backoff.scale == 0.5
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_path"] and report["shadow_backoff"]["written"] == str(policy)
    assert load_policy(policy)[0].routing.learning.shadow_backoff.scale == 1.0
    assert main(args) == 0  # the learned verifier in force: the refit does not beat it
    report = json.loads(capsys.readouterr().out)
    assert report["gain_points"] < 0.5 and report["shadow_backoff"]["won"] is False, report
    learned = load_policy(policy)[0].routing.learning
    assert learned.shadow_backoff.scale == 0.5 and learned.shadow_backoff.factor == 0.5


def test_a_shadow_label_weighs_one_over_its_recorded_chance():
    """A checked answer records the chance it had of a shadow (the backoff's scale then in force): learn weighs its
    shadow label by 1 / that, not by the scale in force now; without one recorded, by the rule in force."""
    from types import SimpleNamespace

    from gateway.commands.learn import _weights
    from policies.schema import LearningSettings, ShadowBackoff

    def request(chance):
        features = {"features": {"context_tokens": 4_000}} | ({"shadow_chance": chance} if chance else {})
        return SimpleNamespace(labels=[{"source": "shadow"}], features=features)

    now = LearningSettings(judge=True, shadow_rate=0.2, shadow_backoff=ShadowBackoff(scale=0.25))
    assert _weights([request(0.2), request(0.1), request(None)], now) == pytest.approx([5.0, 10.0, 20.0])


def test_learn_sets_a_kept_verifiers_threshold_from_every_recorded_score(setup, capsys):
    """--thresholds scores: the verifier in force kept (too few labels for a new one), its threshold escalates the
    share of every recorded checked answer (labelled or not) by their P(good), not chosen on the labels; the refusal
    threshold in force stays. Without --escalation-share the share is the one recorded."""
    from gateway.evaluation.recorded import _numbers
    from gateway.ledger.labels import recorded_requests

    policy, ledger = setup
    learned, _ = load_policy(policy)
    verifier = load_verifier_model(learned, policy)
    rows = [_numbers(r.features["verifier_features"]) for r in recorded_requests(ledger)]
    scores = verifier.scores(rows)
    args = ["learn", "--policy", str(policy), "--ledger-url", str(ledger), "--min-model-labels", "100000", "--json"]
    assert main([*args, "--thresholds", "scores", "--escalation-share", "0.3", "--dry-run"]) == 0
    report = json.loads(capsys.readouterr().out)
    below = sum(s < report["new_threshold"] for s in scores) / len(scores)
    assert len(scores) == 240 and below == pytest.approx(0.3, abs=0.01), report
    assert report["new_refusal_threshold"] == 1.0 and "from their scores" in report["decision"]
    assert main([*args, "--thresholds", "labels", "--escalation-share", "0.3", "--dry-run"]) == 0
    by_labels = json.loads(capsys.readouterr().out)
    assert "new thresholds" in by_labels["decision"]
    assert main([*args, "--thresholds", "scores"]) == 0  # the recorded share: half of them escalated
    report = json.loads(capsys.readouterr().out)
    assert report["escalated_share"] == pytest.approx(0.5)
    assert sum(s < report["new_threshold"] for s in scores) / len(scores) == pytest.approx(0.5, abs=0.01)
    learned, _ = load_policy(policy)
    assert learned.routing.verifier.threshold == pytest.approx(report["new_threshold"])


RELATIVE = {"pool": 1.5, "refusal_spend": 0.9, "window": 200, "warm_up": 20}


def relative_setup(tmp_path, location, bad_groups=None):
    """A policy with a relative rule, and a ledger of what it escalated (tests/support/ledger.relative_ledger)."""
    policy = learned_policy(tmp_path / "policy.yaml", 0.5, relative=RELATIVE)
    relative_ledger(location, load_policy(policy)[0], bad_groups=bad_groups, dead_letter_dir=tmp_path / "dead")
    # the verifier in force stays (thresholds aside): what is tested is the relative rule's re-choice
    args = ["learn", "--policy", str(policy), "--ledger-url", str(location), "--min-model-labels", "100000"]
    return policy, [*args, "--json"]


def test_learn_rechooses_the_relative_rule_when_it_holds_out_of_fold(tmp_path, ledger_location, capsys):
    """Cheap answers in the lowest 45% of P(good) are worse than the long ones in every document: within 60% of the
    long tokens a wider rule than the one in force (escalating about 18%) wins on the labels and out of fold, and
    is written into routing.verifier.relative; --dry-run and --relative fixed write nothing."""
    policy, args = relative_setup(tmp_path, ledger_location)
    before = policy.read_text()
    assert main([*args, "--max-token-share", "0.6", "--relative", "fixed"]) == 0
    assert json.loads(capsys.readouterr().out)["relative"]["decision"] == "--relative fixed: left as it is"
    assert load_policy(policy)[0].routing.verifier.relative.pool == 1.5
    policy.write_text(before)
    assert main([*args, "--max-token-share", "0.6", "--dry-run"]) == 0
    found = json.loads(capsys.readouterr().out)["relative"]
    assert policy.read_text() == before and "written" not in found
    assert found["checked"] == 480 and found["max_token_share"] == 0.6
    assert (found["pool_in_force"], found["refusal_spend_in_force"]) == (1.5, 0.9)
    assert found["token_share_in_force"] < found["token_share"] <= 0.6
    assert found["quality_out_of_fold"] >= found["quality_in_force"] + 0.5, found
    assert "out of fold" in found["decision"] and not found["decision"].startswith("kept")
    assert main([*args, "--max-token-share", "0.6"]) == 0
    written = json.loads(capsys.readouterr().out)["relative"]
    assert written["written"] == str(policy)
    relative = load_policy(policy)[0].routing.verifier.relative
    assert (relative.pool, relative.refusal_spend) == (found["pool"], found["refusal_spend"])
    assert relative.window == 200 and relative.source.startswith("learn ")


def test_learn_keeps_the_relative_rule_when_its_gain_lies_in_two_documents(tmp_path, capsys):
    """The cheap answers are worse only in two documents (g0, g1; a few shadow labels): on all the labels a wider
    rule gains a point, but chosen without a fold's labels it gains nothing on that fold, so out of fold it does not
    beat the one in force: nothing is written."""
    policy, args = relative_setup(tmp_path, tmp_path / "ledger.sqlite3", bad_groups={"g0", "g1"})
    assert main([*args, "--max-token-share", "0.6"]) == 0
    found = json.loads(capsys.readouterr().out)["relative"]
    assert found["quality_on_labels"] >= found["quality_in_force"] + 0.5, found
    assert found["quality_out_of_fold"] < found["quality_in_force"] + 0.5
    assert found["decision"].startswith("kept: ") and "written" not in found
    relative = load_policy(policy)[0].routing.verifier.relative
    assert (relative.pool, relative.refusal_spend, relative.source) == (1.5, 0.9, None)
    assert main(["learn", *args[1:-1]]) == 0  # the text report, at the default budget
    out = capsys.readouterr().out
    assert "relative rule, " in out and "out of fold" in out and "relative rule: " in out
