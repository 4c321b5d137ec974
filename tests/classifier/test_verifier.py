import numpy as np
import pytest

from classifier.answer_features import ANSWER_FEATURE_NAMES
from classifier.estimators import VERIFIER, build_pipeline
from classifier.model import ModelFileError
from classifier.verifier import (
    VerifierModel,
    choice_weights,
    label_good,
    leave_one_group_out_scores,
    leave_one_group_out_splits,
    out_of_fold_scores,
    threshold_for_escalation_share,
    train_verifier,
    verifier_from_bytes,
    verifier_to_bytes,
)


def toy_rows(n_groups=10, per_group=24, noise=0.05, seed=0):
    """Answers that are good when well supported by the passages and not refusals."""
    rng = np.random.default_rng(seed)
    rows, labels, groups = [], [], []
    for g in range(n_groups):
        for _ in range(per_group):
            support = float(rng.uniform())
            refusal = float(rng.uniform() < 0.15)
            good = int(support > 0.5 and not refusal)
            if rng.uniform() < noise:
                good = 1 - good
            rows.append(
                {
                    "ans_support_passages": support,
                    "ans_refusal": refusal,
                    "ans_words": float(rng.integers(1, 60)),
                    "ans_logprob_mean": float("nan"),
                }
            )
            labels.append(good)
            groups.append(f"doc{g}")
    return rows, np.array(labels), groups


def test_label_rule_and_weights():
    assert label_good(0.5, 0.5) == 1
    assert label_good(0.4, 0.5) == 0
    assert label_good(0.45, 0.5, margin=0.1) == 1
    w = choice_weights([1.0, 0.5, 0.2], [0.0, 0.5, 0.3], tie_weight=0.05)
    assert w.tolist() == pytest.approx([1.0, 0.05, 0.1])


@pytest.mark.parametrize("estimator", ["boosting", "logistic"])
def test_trained_on_separable_toy_data_ranks_correctly(estimator):
    rows, labels, groups = toy_rows()
    result = train_verifier(rows, labels, groups, estimator=estimator, n_splits=5, escalation_share=0.5)
    assert result.cv_metrics["roc_auc"] > 0.85
    model = result.model
    strong = {"ans_support_passages": 0.95, "ans_refusal": 0.0, "ans_words": 10.0}
    weak = {"ans_support_passages": 0.05, "ans_refusal": 0.0, "ans_words": 10.0}
    refused = {"ans_support_passages": 0.95, "ans_refusal": 1.0, "ans_words": 10.0}
    assert model.score(strong) > model.score(weak)
    assert model.score(strong) > model.score(refused)
    assert model.threshold is not None
    assert model.escalate(weak) and not model.escalate(strong)


def test_out_of_fold_scores_never_see_their_group():
    rows, labels, groups = toy_rows(n_groups=6)
    # a feature that memorises the group's label rate would only help a leaky fold; here we check shape
    oof = out_of_fold_scores(rows, labels, groups, n_splits=3)
    assert oof.shape == (len(labels),) and np.all((oof >= 0) & (oof <= 1))
    splits = leave_one_group_out_splits(groups)
    g = np.asarray(groups)
    assert len(splits) == 6
    for train, test in splits:
        assert len(set(g[test])) == 1 and not set(g[train]) & set(g[test])
    logo = leave_one_group_out_scores(rows, labels, groups)
    assert logo.shape == (len(labels),) and not np.isnan(logo).any()


def test_group_leakage_is_not_rewarded():
    """A group-id feature with a per-group label is useless out of group: AUC stays near chance."""
    rng = np.random.default_rng(1)
    rows, labels, groups = [], [], []
    for gi in range(12):
        label = gi % 2
        for _ in range(20):
            rows.append({"ans_words": float(gi), "ans_support_passages": float(rng.uniform())})
            labels.append(label)
            groups.append(f"g{gi}")
    oof = leave_one_group_out_scores(rows, np.array(labels), groups, estimator="logistic")
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(labels, oof) < 0.75


def test_serialisation_round_trip_gives_identical_scores():
    rows, labels, groups = toy_rows()
    model = train_verifier(rows, labels, groups, n_splits=3, escalation_share=0.25).model
    data, card_text = verifier_to_bytes(model)
    loaded = verifier_from_bytes(data, card_text)
    assert loaded.feature_names == model.feature_names == list(ANSWER_FEATURE_NAMES)
    assert loaded.threshold == pytest.approx(model.threshold)
    assert loaded.scores(rows[:50]) == model.scores(rows[:50])


def test_loading_refuses_garbage_and_unknown_features():
    rows, labels, groups = toy_rows(n_groups=4)
    model = VerifierModel(build_pipeline("logistic", VERIFIER), ["ans_refusal", "ans_support_passages"])
    model.fit(rows, labels)
    data, _ = verifier_to_bytes(model)
    with pytest.raises(ModelFileError):
        verifier_from_bytes(b"not a skops file")
    with pytest.raises(ModelFileError):
        verifier_from_bytes(data, {"feature_names": ["ans_refusal", "no_such_feature"]})
    with pytest.raises(ModelFileError):  # card says three features, model takes two
        verifier_from_bytes(data, {"feature_names": ["ans_refusal", "ans_support_passages", "ans_words"]})


def test_threshold_for_escalation_share():
    scores = np.linspace(0, 1, 101)
    t = threshold_for_escalation_share(scores, 0.2)
    assert np.mean(scores < t) == pytest.approx(0.2, abs=0.011)
    assert threshold_for_escalation_share(scores, 0.0) == 0.0
    assert np.all(scores < threshold_for_escalation_share(scores, 1.0))


def test_one_label_refused():
    rows, labels, groups = toy_rows(n_groups=3)
    with pytest.raises(ValueError):
        train_verifier(rows, np.ones(len(labels), int), groups)


def test_protocol_splits_hold_out_a_corpus_or_a_model_and_its_documents():
    from classifier.verifier import protocol_splits, split_units

    n = 48
    labels = np.array([i % 2 for i in range(n)])
    groups = [f"doc{i % 8}" for i in range(n)]
    corpora = ["a" if i % 8 < 4 else "b" for i in range(n)]
    models = [f"m{i % 3}" for i in range(n)]
    corpus = protocol_splits("corpus", labels, groups, corpora=corpora)
    assert [s.unit for s in corpus] == ["a", "b"]
    for s in corpus:
        assert {corpora[i] for i in s.test} == {s.unit} and s.unit not in {corpora[i] for i in s.train}
    model = protocol_splits("model", labels, groups, models=models, n_splits=4)
    assert sorted({s.unit for s in model}) == ["m0", "m1", "m2"]
    for s in model:
        # neither the held-out model nor any of its test documents is in the training part
        assert {models[i] for i in s.test} == {s.unit} and s.unit not in {models[i] for i in s.train}
        assert not {groups[i] for i in s.test} & {groups[i] for i in s.train}
    units = split_units(model, n)
    assert units == models  # every example scored exactly once, by its own model's unit
    assert sorted(i for s in model for i in s.test) == list(range(n))
    with pytest.raises(ValueError, match="at least two corpora"):
        protocol_splits("corpus", labels, groups, corpora=["a"] * n)
    with pytest.raises(ValueError, match="unknown protocol"):
        protocol_splits("bogus", labels, groups)


def test_gain_auc_and_escalation_gain_over_random():
    from classifier.verifier import escalation_gain_points, gain_auc

    rag = np.array([1.0, 0.0, 1.0, 0.0, 0.5])
    lc = np.array([0.0, 1.0, 1.0, 1.0, 0.5])
    perfect = np.array([0.9, 0.1, 0.5, 0.2, 0.5])
    assert gain_auc(rag, lc, perfect) == 1.0 and gain_auc(rag, lc, -perfect) == 0.0
    # escalating the 2 of 5 the verifier trusts least gains +2 (both were rag 0 / long 1); random: 2/5 of +1
    assert escalation_gain_points(rag, lc, perfect, share=0.4) == pytest.approx(100 * (2 - 0.4 * 1) / 5)
    assert gain_auc(rag, rag, perfect) is None


def test_permutation_importance_finds_the_feature_that_carries_the_signal():
    from classifier.verifier import choice_weights, permutation_importance, protocol_splits, split_units

    rows, labels, groups = toy_rows(n_groups=8, per_group=30)
    rag = labels.astype(float)
    lc = 1.0 - rag
    corpora = ["a" if int(g[3:]) < 4 else "b" for g in groups]
    splits = protocol_splits("corpus", labels, groups, corpora=corpora)
    result = dict(
        permutation_importance(
            rows,
            labels,
            rag,
            lc,
            splits,
            split_units(splits, len(rows)),
            feature_names=["ans_support_passages", "ans_refusal", "ans_words"],
            estimator="logistic",
            sample_weight=choice_weights(rag, lc),
        )
    )
    assert result["(none shuffled: the scores)"]["auc"] > 0.8
    assert result["ans_support_passages"]["auc"] > 0.2 and result["ans_support_passages"]["transfer"] > 5
    assert abs(result["ans_words"]["auc"]) < 0.05  # noise carries nothing across corpora


def test_monotone_directions_follow_the_training_rows_and_the_fit_holds_them():
    """monotone_directions: +1 / -1 where a feature's rank correlation with the label is clear, 0 where it is noise
    or the feature is constant or absent; the "monotonic" verifier's P(good) then moves one way along each held
    feature, whatever bump the rows put there."""
    import numpy as np

    from classifier.verifier import monotone_directions, new_verifier

    rng = np.random.default_rng(0)
    n = 4_000
    up, down, noise = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    # a bump: good answers at both ends of `up` in a tenth of the rows (one corpus's style), mostly increasing
    y = ((up + rng.normal(0, 1, n) > 0) | ((up < -1.5) & (rng.random(n) < 0.9))).astype(int)
    y = np.where(down > 1.0, 0, y)
    x = np.column_stack([up, down, noise, np.full(n, 2.0), np.full(n, np.nan)])
    assert monotone_directions(x, y) == [1, -1, 0, 0, 0]
    assert monotone_directions(x, y, np.ones(n) * 3) == [1, -1, 0, 0, 0]  # weights scale nothing away
    names = ["up", "down", "noise", "constant", "absent"]
    rows = [dict(zip(names, r)) for r in x.tolist()]
    free, held = (new_verifier(e, names).fit(rows, y) for e in ("boosting", "monotonic"))
    grid = [dict(zip(names, [v, 0.0, 0.0, 2.0, float("nan")])) for v in np.linspace(-3, 3, 61)]
    assert np.all(np.diff(held.scores(grid)) >= 0)
    assert np.any(np.diff(free.scores(grid)) < -1e-3)  # the free trees learn the bump
