"""The answer verifier's inputs for paired examples, computed as the gateway computes them.

Each recorded cheap (RAG) answer is paired with the passages our retrieval places in the cheap prompt
for that question and the document's term index (gateway.evaluation.examples.RouteInputBuilder), then
turned into features by gateway.routing.escalation.CheapAnswerCheck.features, the function the live
check uses. `selfroute train --verifier`, `selfroute calibrate` and `selfroute eval replay` share this.
"""
from __future__ import annotations

from typing import Sequence

from gateway.evaluation.examples import Example, RouteInputBuilder
from gateway.routing.escalation import CheapAnswer, CheapAnswerCheck
from policies.schema import Policy


def cheap_answers(builder: RouteInputBuilder, examples: Sequence[Example], progress: bool = False) -> list[CheapAnswer]:
    """The recorded cheap answer (`rag_pred`) of each example with what the cheap model saw."""
    from tqdm import tqdm

    out = []
    for e in tqdm(examples, desc="verifier inputs", disable=not progress, unit="q"):
        out.append(CheapAnswer(e.record.get("rag_pred"), e.query, builder.passages(e), builder.document_index(e)))
    return out


def answer_rows(answers: Sequence[CheapAnswer], probabilities: Sequence[float | None] | None = None) -> list[dict]:
    """Verifier features per answer; `probabilities`: the pre-route P(cheap) of each (out of fold), if any."""
    probabilities = probabilities if probabilities is not None else [None] * len(answers)
    return [CheapAnswerCheck.features(a, p) for a, p in zip(answers, probabilities)]


def replay_scores(policy: Policy, policy_file, examples, inputs, builder: RouteInputBuilder, *, protocol: str = "grouped",
                  estimator: str = "boosting", folds: int = 5, seed: int = 0, model=None, verifier_file=None,
                  verifier_threshold: float | None = None, progress: bool = False):
    """(P(cheap), verifier P(good) or None, verifier threshold or None) per example, for the replay and calibrate.

    P(cheap): from `model` (a route model file) as it is, else out of fold (protocol "grouped": k folds by
    document; "loto": leave one task out). P(good): from `verifier_file` as it is, else, when
    the policy has routing.verifier, out of fold like P(cheap) (answer features, choice-weighted labels);
    None when neither. The threshold: `verifier_threshold`, else the policy's, else the verifier card's."""
    import numpy as np

    from classifier.answer_features import ANSWER_FEATURE_NAMES
    from classifier.training import label_from_scores, out_of_fold_probabilities
    from classifier.verifier import (
        choice_weights, label_good, leave_one_group_out_scores, leave_one_group_out_splits, out_of_fold_scores,
    )
    from gateway.routing.model_files import load_model, load_verifier, load_verifier_model

    labels = [label_from_scores(e.record["rag_score"], e.record["lc_score"]) for e in examples]
    groups = [e.group for e in examples]
    tasks = [str(e.record.get("task") or "") for e in examples]
    if protocol == "loto" and len(set(tasks)) < 2:
        raise ValueError("--protocol loto needs a `task` field with at least two tasks")
    rows = [i.features for i in inputs]
    if model is not None:
        probabilities = load_model(model).cheap_probabilities(rows)
    else:
        splits = leave_one_group_out_splits(tasks) if protocol == "loto" else None
        probabilities = out_of_fold_probabilities(rows, labels, groups, estimator, folds, seed, splits=splits)
    verifier, threshold = None, verifier_threshold
    if verifier_file is not None:
        verifier = load_verifier(verifier_file)
    elif policy.routing.verifier is None:
        return probabilities, None, None
    if threshold is None and policy.routing.verifier is not None:
        threshold = policy.routing.verifier.threshold
    if threshold is None:  # the card's: of the given verifier, else of the policy's (refitted here)
        threshold = (verifier or load_verifier_model(policy, policy_file)).threshold
    if threshold is None:
        raise ValueError("no verifier threshold: give --verifier-threshold")
    answers = answer_rows(cheap_answers(builder, examples, progress=progress), probabilities)
    if verifier is not None:
        return probabilities, verifier.scores(answers), threshold
    rag = [float(e.record["rag_score"]) for e in examples]
    lc = [float(e.record["lc_score"]) for e in examples]
    y = np.array([label_good(r, c) for r, c in zip(rag, lc)])
    names = [n for n in ANSWER_FEATURE_NAMES if n != "pre_route_probability"]
    kwargs = dict(estimator=estimator, seed=seed, feature_names=names, sample_weight=choice_weights(rag, lc))
    if protocol == "loto":
        scores = leave_one_group_out_scores(answers, y, tasks, **kwargs)
    else:
        scores = out_of_fold_scores(answers, y, groups, n_splits=folds, **kwargs)
    return probabilities, [float(s) for s in scores], threshold
