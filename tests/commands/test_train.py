"""`selfroute train` and `selfroute calibrate` end to end on a tiny synthetic set (real MiniLM + LanceDB)."""

import json
import shutil
from pathlib import Path

import pytest

from classifier.calibration import long_share
from classifier.features import FEATURE_NAMES
from gateway.cli import main
from gateway.routing.model_files import load_model
from policies.loader import load_policy, shipped_policy_path
from policies.schema import RelativeThreshold
from tests.support.policies import write_shipped_policy
from tests.support.routing import two_task_fixture, write_paired_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Train once for the module on five of the six documents; the sixth is held out."""
    folder = tmp_path_factory.mktemp("train")
    paired, docs = write_paired_fixture(folder)
    rows = [json.loads(line) for line in paired.read_text().splitlines()]
    held_out_doc = rows[-1]["doc_id"]
    train_file = folder / "train.jsonl"
    train_file.write_text("".join(json.dumps(r) + "\n" for r in rows if r["doc_id"] != held_out_doc))
    held_file = folder / "held_out.jsonl"
    held_file.write_text("".join(json.dumps(r) + "\n" for r in rows if r["doc_id"] == held_out_doc))
    model = folder / "model.skops"
    oof = folder / "oof.jsonl"
    data_dir = folder / "data"
    rc = main(
        [
            "train",
            "--data",
            str(train_file),
            "--docs",
            str(docs),
            "--out",
            str(model),
            "--folds",
            "5",
            "--oof-out",
            str(oof),
            "--data-dir",
            str(data_dir),
            "--log-level",
            "WARNING",
            "--estimator",
            "logistic",
        ]
    )  # 25 examples: too few for trees with 30-sample leaves
    assert rc == 0
    return {
        "folder": folder,
        "docs": docs,
        "model": model,
        "oof": oof,
        "data_dir": data_dir,
        "train": train_file,
        "held_out": held_file,
    }


def test_train_writes_model_and_card(trained):
    card = json.loads(trained["model"].with_suffix(".json").read_text())
    assert card["feature_names"] == FEATURE_NAMES
    assert card["training_examples"] == 25 and card["training_documents"] == 5
    assert len(card["training_document_hashes"]) == 5
    assert card["label_rule"].startswith("cheap suffices (label 1) when rag_score >= lc_score - 0")
    metrics = card["cv_metrics_grouped_by_document"]
    assert metrics["n_splits"] == 5 and metrics["n"] == 25 and "roc_auc" in metrics
    assert card["training_command"].startswith("selfroute train --data ")
    assert card["training_data_hash"].startswith("sha256:")
    assert card["limitations"].startswith("Not measured on held-out corpora or model families")
    assert card["training_corpora"]["train"]["documents_available"] == 6  # the sixth document was held out
    assert card["limitations"].endswith("train on 5 of the 6 documents in its folder.")


def test_trained_model_separates_summary_from_factoid_questions(trained, capsys):
    from gateway.evaluation.examples import RouteInputBuilder, load_examples

    policy, _ = load_policy()
    builder = RouteInputBuilder(policy, trained["data_dir"] / "lancedb", cache_dir=trained["data_dir"] / "cache")
    examples = load_examples(trained["held_out"], trained["docs"])
    rows = [i.features for i in builder.all_inputs(examples, progress=False, with_long=False)]
    model = load_model(trained["model"])
    p = model.cheap_probabilities(rows)
    factoid, summary = p[:3], p[3:]
    assert min(factoid) > max(summary)
    # retrieval really ran: the keeper's name is in the top chunks
    assert rows[0]["has_retrieval"] == 1.0 and rows[0]["top_term_coverage"] > 0


def test_calibrate_from_out_of_fold_predictions_keeps_comments(trained, tmp_path, capsys):
    policy_file = tmp_path / "policy.yaml"
    shutil.copy(shipped_policy_path(), policy_file)
    before = policy_file.read_text()
    rc = main(["calibrate", "--data", str(trained["oof"]), "--target-long-share", "0.4", "--policy", str(policy_file)])
    assert rc == 0
    after = policy_file.read_text()
    assert before.splitlines()[0] in after  # the leading comment survives
    policy, _ = load_policy(policy_file)
    oof = [json.loads(line)["p_cheap"] for line in trained["oof"].read_text().splitlines()]
    assert long_share(oof, policy.routing.classifier.threshold) == pytest.approx(0.4, abs=1 / len(oof) + 1e-9)
    assert "out-of-fold" in policy.routing.classifier.threshold_source
    assert "go long" in capsys.readouterr().out


def test_calibrate_on_examples_skips_the_training_documents(trained, tmp_path, capsys):
    classifier = {"model_path": str(trained["model"])}
    policy_file = write_shipped_policy(tmp_path / "policy.yaml", routing={"classifier": classifier})
    text = policy_file.read_text()
    common = ["--docs", str(trained["docs"]), "--policy", str(policy_file), "--data-dir", str(trained["data_dir"])]
    rc = main(["calibrate", "--data", str(trained["train"]), "--target-long-share", "0.3", *common])
    assert rc == 2 and "training data" in capsys.readouterr().err
    both = tmp_path / "both.jsonl"
    both.write_text(trained["train"].read_text() + trained["held_out"].read_text())
    rc = main(["calibrate", "--data", str(both), "--target-long-share", "0.4", "--dry-run", *common])
    out = capsys.readouterr().out
    assert rc == 0 and "skipped 25 examples" in out and "of 5 requests go long" in out
    assert policy_file.read_text() == text  # dry run: untouched


@pytest.fixture(scope="module")
def verifier_trained(trained):
    paired = two_task_fixture(trained["folder"])
    out = trained["folder"] / "verifier.skops"
    common = [
        "--docs",
        str(trained["docs"]),
        "--data-dir",
        str(trained["data_dir"]),
        "--prices",
        "reference",
        "--log-level",
        "WARNING",
    ]
    rc = main(
        [
            "train",
            "--verifier",
            "--data",
            str(paired),
            "--out",
            str(out),
            "--estimator",
            "logistic",
            "--folds",
            "3",
            "--max-cost-share",
            "0.6",
            *common,
        ]
    )
    assert rc == 0
    return {"paired": paired, "model": out, "common": common}


def test_train_verifier_writes_the_verifier_with_its_cost_capped_threshold(verifier_trained, capsys):
    from classifier.verifier import TRANSFER_FEATURE_NAMES
    from gateway.routing.model_files import load_verifier

    card = json.loads(verifier_trained["model"].with_suffix(".json").read_text())
    assert card["feature_names"] == TRANSFER_FEATURE_NAMES  # --features transfer, the default
    assert 0.0 <= card["threshold"] <= 1.0
    assert "cost <= 0.6 of always-long on leave one task out" in card["threshold_source"]
    assert card["training_examples"] == 30 and card["training_tasks"] == ["even", "odd"]
    assert card["training_command"].startswith("selfroute train --data ") and "--verifier" in card["training_command"]
    verifier = load_verifier(verifier_trained["model"])
    # the refusals and the wrong summaries are the answers it doubts most
    from gateway.routing.escalation import CheapAnswer, CheapAnswerCheck

    good = CheapAnswerCheck.features(
        CheapAnswer(
            "Ada Quill0", "Who is the keeper of Kestrel Harbour?", ["The keeper of Kestrel Harbour is Ada Quill0."]
        ),
        None,
    )
    refusal = CheapAnswerCheck.features(
        CheapAnswer(
            "unanswerable", "What is the report about overall?", ["The keeper of Kestrel Harbour is Ada Quill0."]
        ),
        None,
    )
    assert verifier.score(good) > verifier.score(refusal)


def test_train_verifier_with_the_portable_features(verifier_trained, tmp_path):
    from classifier.verifier import PORTABLE_FEATURE_NAMES, SIGN_FLIP_FEATURES
    from gateway.routing.model_files import load_verifier

    out = tmp_path / "portable.skops"
    args = ["train", "--verifier", "--data", str(verifier_trained["paired"]), "--out", str(out), "--folds", "3"]
    rc = main([*args, "--estimator", "logistic", "--features", "portable", *verifier_trained["common"]])
    assert rc == 0
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["feature_names"] == PORTABLE_FEATURE_NAMES and card["estimator"] == "logistic"
    assert "--features portable" in card["training_command"]
    verifier = load_verifier(out)
    assert "query_global_cue" in verifier.feature_names
    assert not set(SIGN_FLIP_FEATURES) & set(verifier.feature_names)


def test_calibrate_replay_targets_set_both_thresholds(trained, verifier_trained, tmp_path, capsys):
    policy_file = tmp_path / "policy.yaml"
    shutil.copy(shipped_policy_path(), policy_file)
    before = policy_file.read_text()
    args = [
        "calibrate",
        "--data",
        str(verifier_trained["paired"]),
        "--policy",
        str(policy_file),
        "--estimator",
        "logistic",
        "--folds",
        "3",
        *verifier_trained["common"],
    ]
    assert main([*args, "--max-cost-share", "0.5"]) == 0
    out = capsys.readouterr().out
    policy, _ = load_policy(policy_file)
    assert policy.routing.verifier.threshold_source.startswith("calibrate: cost <= 0.5 of always-long on the grouped")
    assert policy.routing.classifier.threshold_source == policy.routing.verifier.threshold_source
    assert "verifier threshold" in out and before.splitlines()[0] in policy_file.read_text()
    cost = float(out.split(" of its cost")[0].rsplit(" at ", 1)[1])
    assert cost <= 0.5
    # the shipped policy sets a relative rule: its parameters chosen across the two tasks and written with their source
    assert "relative rule (routing.verifier.relative)" in out and "held out" in out
    relative = policy.routing.verifier.relative
    if relative is not None:
        assert relative.source.startswith("calibrate (grouped 3-fold replay of ") and "units: task" in relative.source
    else:
        assert "relative: null" in policy_file.read_text()  # the fixed thresholds did best
    # the cheapest setting at least 20 points above always-long: none on this data; the policy stays
    written = policy_file.read_text()
    assert main([*args, "--min-quality-delta", "20", "--protocol", "loto"]) == 1
    assert "target not met" in capsys.readouterr().out and policy_file.read_text() == written
    # at or above always-long: met, and the verifier escalates the answers it doubts
    assert main([*args, "--min-quality-delta", "0", "--dry-run"]) == 0
    assert "+" in capsys.readouterr().out and policy_file.read_text() == written


def test_calibrate_under_a_warm_prompt_cache_says_so_in_the_policy(verifier_trained, tmp_path, capsys):
    policy_file = tmp_path / "policy.yaml"
    shutil.copy(shipped_policy_path(), policy_file)
    args = [
        "calibrate",
        "--data",
        str(verifier_trained["paired"]),
        "--policy",
        str(policy_file),
        "--estimator",
        "logistic",
        "--folds",
        "3",
        "--max-cost-share",
        "0.5",
        *verifier_trained["common"],
    ]
    assert main([*args, "--prompt-cache", "on"]) == 2  # the reference pair has no cache prices
    assert "--long-cache-prices" in capsys.readouterr().err
    assert main([*args, "--long-cache-prices", "0.3,3.75", "--cache-window", "3"]) == 0
    out = capsys.readouterr().out
    cost = float(out.split(" of its cost")[0].rsplit(" at ", 1)[1])
    assert cost <= 0.5
    policy, _ = load_policy(policy_file)
    assert (
        "with a warm prompt cache (read 0.3/M, write 3.75/M, 3-question window)"
        in policy.routing.verifier.threshold_source
    )


def test_verifier_trained_on_two_corpora_with_thresholds_chosen_across_them(tmp_path):
    from tests.support.routing import two_corpora

    pairs = two_corpora(tmp_path)
    out = tmp_path / "verifier.skops"
    assert (
        main(
            [
                "train",
                "--verifier",
                *pairs,
                "--out",
                str(out),
                "--estimator",
                "logistic",
                "--folds",
                "3",
                "--protocol",
                "corpus",
                "--max-token-share",
                "0.9",
                "--prices",
                "reference",
                "--data-dir",
                str(tmp_path / "data"),
                "--log-level",
                "WARNING",
            ]
        )
        == 0
    )
    card = json.loads(out.with_suffix(".json").read_text())
    assert set(card["training_corpora"]) == {"alpha", "beta"} and card["training_models"] == ["m0", "m1"]
    assert card["threshold_protocol"] == "leave one corpus out"
    held = card["held_out_validation"]["units"]
    assert set(held) == {"alpha", "beta"} and held["alpha"]["n"] == 15
    assert "verifier_vs_random_points_at_25" in held["beta"] and "tokens_vs_long" in held["beta"]["at_threshold"]
    assert "ans_words" not in card["feature_names"]  # the transfer set: no absolute answer length
    assert card["training_command"].count("--data ") == 2 and "--protocol corpus" not in card["training_command"]
    assert "--threshold-protocol corpus" in card["training_command"]
    # the card's generated parts: the three thresholds chosen together with the pre-route (the shipped policy has a
    # classifier), each unit's router figures and threshold curve, coverage and limitations from those figures
    chosen = card["policy_thresholds"]
    assert chosen["threshold"] == card["threshold"] and chosen["refusal_threshold"] == card["refusal_threshold"]
    assert chosen["classifier_threshold"] is not None and set(chosen["per_unit"]) == {"alpha", "beta"}
    assert held["alpha"]["router_at_policy_thresholds"] == chosen["per_unit"]["alpha"]
    # the relative rule's parameters: chosen on both corpora through the live check, the chosen thresholds deciding
    # the warm-up; nested, each corpus scored by the choice made on the other alone
    relative = chosen["relative"]
    assert set(relative["per_unit"]) == {"alpha", "beta"} and relative["max_token_share"] == 0.9
    assert relative["held_out"]["alpha"]["chosen_on"] == ["beta"] and relative["held_out"]["beta"]["chosen_on"] == [
        "alpha"
    ]
    assert relative["source"].startswith("train --verifier --max-token-share 0.9 (leave one corpus out): chosen")
    assert relative["held_out_both_targets"] == sum(
        u["within_1_point"] and u["beats_self_route"] for u in relative["held_out"].values()
    )
    if relative["settings"] is not None:
        assert RelativeThreshold(**relative["settings"])  # loads as a policy's routing.verifier.relative
    assert set(held["beta"]["threshold_curve"]["tokens_vs_long"]) == {"0.1", "0.2", "0.3", "0.5", "1"}
    assert card["training_corpora"]["alpha"]["documents"] == 3
    assert card["training_corpora"]["alpha"]["documents_available"] == 6
    points = held["alpha"]["verifier_vs_random_points_at_25"]
    assert card["limitations"].startswith("Measured leave one corpus out: escalating the 25%")
    assert f"{points:+.2f} points with alpha held out" in card["limitations"]
    assert card["limitations"].endswith(
        "alpha on 3 of the 6 documents in its folder; beta on 3 of the 6 documents in its folder."
    )
    route = tmp_path / "route.skops"
    assert (
        main(
            [
                "train",
                *pairs,
                "--out",
                str(route),
                "--estimator",
                "logistic",
                "--folds",
                "3",
                "--protocol",
                "model",
                "--data-dir",
                str(tmp_path / "data"),
                "--log-level",
                "WARNING",
            ]
        )
        == 0
    )
    card = json.loads(route.with_suffix(".json").read_text())
    assert set(card["held_out_validation"]["units"]) == {"m0", "m1"}
    assert set(card["training_corpora"]) == {"alpha", "beta"}
    auc = card["held_out_validation"]["units"]["m0"]["roc_auc"]
    assert card["limitations"].startswith(
        f"Measured leave one model family out (and its documents' fold): ROC AUC {auc:.3f} with m0 held out"
    )


def test_the_verifiers_threshold_choice_refits_the_pre_route_with_its_own_estimator(tmp_path):
    from gateway.commands.train import _pre_route_estimator
    from tests.support.policies import write_shipped_policy

    policy, policy_file = load_policy()  # the shipped classifier: boosted trees, whatever the verifier's --estimator
    assert _pre_route_estimator(policy, policy_file, "logistic") == "boosting"
    missing = write_shipped_policy(tmp_path / "p.yaml", routing={"classifier": {"model_path": "absent.skops"}})
    policy, policy_file = load_policy(missing)
    assert _pre_route_estimator(policy, policy_file, "logistic") == "logistic"


def test_train_verifier_with_the_portable_features_and_the_support(verifier_trained, tmp_path):
    """--features portable+support: the answers and their sentences embedded once and cached by text under the data
    directory, the chunks sent read from its store; the support is in the rows the verifier was fitted on."""
    import sqlite3

    from classifier.answer_features import SUPPORT_FEATURES
    from classifier.verifier import PORTABLE_SUPPORT_FEATURE_NAMES
    from gateway.evaluation.verification import EMBEDDINGS_FILE
    from gateway.routing.model_files import load_verifier

    assert PORTABLE_SUPPORT_FEATURE_NAMES[-len(SUPPORT_FEATURES) :] == list(SUPPORT_FEATURES)
    out = tmp_path / "portable-support.skops"
    args = ["train", "--verifier", "--data", str(verifier_trained["paired"]), "--out", str(out), "--folds", "3"]
    rc = main([*args, "--estimator", "logistic", "--features", "portable+support", *verifier_trained["common"]])
    assert rc == 0
    verifier = load_verifier(out)
    assert verifier.feature_names == PORTABLE_SUPPORT_FEATURE_NAMES
    cache = verifier_trained["common"][verifier_trained["common"].index("--data-dir") + 1]
    with sqlite3.connect(Path(cache) / "cache" / EMBEDDINGS_FILE) as conn:
        assert conn.execute("SELECT count(*) FROM vectors").fetchone()[0] > 0
    # the support was computed for the training rows: a column missing throughout would be dropped by the imputer,
    # and the score would not move with it
    base = {n: 0.0 for n in PORTABLE_SUPPORT_FEATURE_NAMES}
    low, high = ({**base, **{n: v for n in SUPPORT_FEATURES}} for v in (0.1, 0.9))
    assert verifier.score(low) != verifier.score(high)
