"""`selfroute train` and `selfroute calibrate` end to end on a tiny synthetic set (real MiniLM + LanceDB)."""
import json
import shutil

import pytest

from classifier.calibration import long_share
from classifier.features import FEATURE_NAMES
from gateway.routing.model_files import load_model
from gateway.cli import main
from policies.loader import load_policy, shipped_policy_path
from tests.routing_fixtures import write_paired_fixture

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
    rc = main(["train", "--data", str(train_file), "--docs", str(docs), "--out", str(model), "--folds", "5",
               "--oof-out", str(oof), "--data-dir", str(data_dir), "--log-level", "WARNING",
               "--estimator", "logistic"])  # 25 examples: too few for trees with 30-sample leaves
    assert rc == 0
    return {"folder": folder, "docs": docs, "model": model, "oof": oof, "data_dir": data_dir,
            "train": train_file, "held_out": held_file}


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
    policy_file = tmp_path / "policy.yaml"
    text = shipped_policy_path().read_text().replace("builtin:default", str(trained["model"]))
    policy_file.write_text(text)
    common = ["--docs", str(trained["docs"]), "--policy", str(policy_file), "--data-dir", str(trained["data_dir"])]
    rc = main(["calibrate", "--data", str(trained["train"]), "--target-long-share", "0.3", *common])
    assert rc == 2 and "training data" in capsys.readouterr().err
    both = tmp_path / "both.jsonl"
    both.write_text(trained["train"].read_text() + trained["held_out"].read_text())
    rc = main(["calibrate", "--data", str(both), "--target-long-share", "0.4", "--dry-run", *common])
    out = capsys.readouterr().out
    assert rc == 0 and "skipped 25 examples" in out and "of 5 requests go long" in out
    assert policy_file.read_text() == text  # dry run: untouched
