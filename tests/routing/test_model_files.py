import json
import math

import pytest

from classifier.features import FEATURE_NAMES, DocumentStats, RetrievalSignals, extract_features
from classifier.model import ModelFileError, RouteModel
from classifier.training import train
from gateway.routing.model_files import builtin_model_path, card_path, load_model, save_model
from tests.support.classifier import synthetic_rows


@pytest.fixture(scope="module")
def shipped():
    return load_model(builtin_model_path())


def test_shipped_model_loads_scores_and_has_its_card(shipped):
    stats = DocumentStats(20000, 20000, 1, 12, 3)
    factoid = extract_features(
        "Who signed the lease?", stats, RetrievalSignals([0.7, 0.6], ["a", "a"], ["lease signed"] * 2)
    )
    p = shipped.cheap_probability(factoid)
    assert 0.0 <= p <= 1.0
    no_retrieval = shipped.cheap_probability(extract_features("Who signed the lease?", stats, None))
    assert 0.0 <= no_retrieval <= 1.0 and not math.isnan(no_retrieval)
    card = shipped.card
    assert card["feature_names"] == FEATURE_NAMES
    assert card["training_data_hash"].startswith("sha256:")
    assert card["cv_metrics_grouped_by_document"]["roc_auc"] > 0.5
    assert card["training_command"].startswith("selfroute train")
    assert builtin_model_path().stat().st_size < 200_000  # shipped in the wheel: keep it small
    # trained on both corpora, validated leaving one corpus out (BENCHMARKS.md section 4)
    assert set(card["training_corpora"]) == {"leval", "lara128k"} and card["training_examples"] == 11267
    assert card["held_out_validation"]["protocol"] == "leave one corpus out"
    # every LaRA document, and limitations written by `selfroute train` from those held-out figures
    lara = card["training_corpora"]["lara128k"]
    assert lara["documents"] == lara["documents_available"] == 67 and lara["examples"] == 9939
    assert card["limitations"].startswith("Measured leave one corpus out: ROC AUC ")


def test_save_load_round_trip(tmp_path):
    rows, labels, groups = synthetic_rows(n_docs=8, per_doc=6)
    result = train(rows, labels, groups, n_splits=3)
    path = tmp_path / "m.skops"
    written_card = save_model(RouteModel(result.pipeline, {"feature_names": FEATURE_NAMES, "x": float("nan")}), path)
    assert written_card == card_path(path) and json.loads(written_card.read_text())["x"] is None
    loaded = load_model(path)
    assert loaded.cheap_probabilities(rows[:5]) == pytest.approx(
        result.pipeline.predict_proba(__import__("numpy").asarray([[r[n] for n in FEATURE_NAMES] for r in rows[:5]]))[
            :, 1
        ]
    )


def arbitrary_code(x):
    return x


def test_refuses_types_outside_the_trusted_list(tmp_path):
    import skops.io as sio
    from sklearn.pipeline import FunctionTransformer, Pipeline

    # a FunctionTransformer wrapping an arbitrary function is exactly what must not load silently
    pipeline = Pipeline([("f", FunctionTransformer(arbitrary_code))])
    path = tmp_path / "evil.skops"
    sio.dump(pipeline, path)
    with pytest.raises(ModelFileError, match="trusted"):
        load_model(path)


def test_refuses_another_feature_set_and_missing_files(tmp_path):
    rows, labels, groups = synthetic_rows(n_docs=6, per_doc=6)
    result = train(rows, labels, groups, n_splits=3)
    path = tmp_path / "old.skops"
    save_model(RouteModel(result.pipeline, {"feature_names": FEATURE_NAMES[:-1]}), path)
    with pytest.raises(ModelFileError, match="different feature set"):
        load_model(path)
    with pytest.raises(ModelFileError, match="not found"):
        load_model(tmp_path / "absent.skops")


def test_shipped_verifier_loads_with_its_card_and_threshold():
    from classifier.answer_features import answer_features
    from classifier.verifier import PORTABLE_FEATURE_NAMES
    from gateway.routing.model_files import load_verifier, load_verifier_model, resolve_model_path
    from policies.loader import load_policy

    path = resolve_model_path("builtin:verifier", None)
    assert path == builtin_model_path("verifier") and path.stat().st_size < 200_000
    verifier = load_verifier(path)
    # trained on L-Eval and LaRA-128k (every model family) with the portable features (their direction holds across
    # corpora and model families), its threshold chosen leaving one corpus out (BENCHMARKS.md section 4)
    assert verifier.feature_names == PORTABLE_FEATURE_NAMES
    assert 0.0 <= verifier.threshold < 1.0 and verifier.card["training_examples"] == 11267
    assert "leave one corpus out" in verifier.card["threshold_source"]
    assert verifier.card["limitations"].startswith("Measured leave one corpus out: escalating the 25%")
    passages = ["The maintenance password for the Zephyr pump is BLUE-HERON-42."]
    grounded = answer_features("What is the password?", "BLUE-HERON-42", passages, passages[0])
    assert set(verifier.feature_names) <= set(grounded)  # the live check computes every feature it reads
    assert 0.0 <= verifier.score(grounded) <= 1.0
    policy, policy_file = load_policy()  # the default policy checks answers with it
    assert load_verifier_model(policy, policy_file).source == str(path)
    # ...and can escalate: refusals the verifier doubts go long (Self-Route's rule), so streams are held for it
    from gateway.routing.escalation import CheapAnswerCheck

    assert 0.0 < policy.routing.verifier.refusal_threshold <= 1.0
    # the default policy ships the thresholds the verifier's training chose together (its card, rounded)
    chosen = verifier.card["policy_thresholds"]
    assert policy.routing.classifier.threshold == pytest.approx(chosen["classifier_threshold"], abs=5e-5)
    assert policy.routing.verifier.threshold == pytest.approx(chosen["threshold"], abs=5e-5)
    assert policy.routing.verifier.refusal_threshold == pytest.approx(chosen["refusal_threshold"], abs=5e-5)
    assert CheapAnswerCheck(policy, verifier).can_escalate
    with pytest.raises(ValueError, match="builtin:verifier"):
        resolve_model_path("builtin:nope", None)


def test_verifier_save_load_round_trip_and_a_card_without_threshold(tmp_path):
    from gateway.routing.model_files import load_verifier, load_verifier_model, save_verifier
    from policies.schema import Policy
    from tests.support.routed import toy_verifier

    model = toy_verifier()
    path = tmp_path / "v.skops"
    assert save_verifier(model, path) == card_path(path)
    loaded = load_verifier(path)
    row = {"ans_support_passages": 0.9, "ans_refusal": 0.0}
    assert loaded.score(row) == pytest.approx(model.score(row)) and loaded.threshold == pytest.approx(model.threshold)
    card = json.loads(card_path(path).read_text())
    del card["threshold"]
    card_path(path).write_text(json.dumps(card))
    policy = Policy.model_validate(
        {"cheap": {"model": "a/c"}, "long": {"model": "a/l"}, "routing": {"verifier": {"model_path": str(path)}}}
    )
    with pytest.raises(ModelFileError, match="no threshold"):
        load_verifier_model(policy)
    with pytest.raises(ModelFileError, match="not found"):
        load_verifier(tmp_path / "absent.skops")
