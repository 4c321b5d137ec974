"""`selfroute learn --policy P [--since 30d] [--blend-shipped PAIRED.jsonl --blend-docs DIR] [--dry-run]`: refit
the answer verifier and, with enough labels, the pre-route classifier on the ledger's labels (optionally blended with
the shipped training data), compare each out of fold with the model in force on those labels, and only when a refit
is better write its new model file beside the policy and point the policy at it (the old file is kept; a running
gateway loads it at its policy reload, `POST /v1/admin/reload`, or a restart).

The comparison: folds grouped by document (the features' `group`), each labelled request scored by a model fitted
without its document (and, with --blend-shipped, on all of the shipped data, which is never scored); the model in
force scores the same requests as it is. Both escalate the same share of the labelled cheap answers (the verifier:
the share the policy in force escalates on them; the classifier: the share the policy in force sent long after their
cheap answer, here sent long up front), least trusted first; the replay quality is the share of labelled requests
whose answer is as good as the long route's (an escalated answer is; an accepted one is when its label says so).
Shadow labels stand for all accepted answers (weight 1 / shadow_rate). A new classifier's threshold keeps the share
of recorded requests the classifier in force sent long.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.commands._common import add_ledger_argument, ledger_location
from gateway.files import write_atomic

MIN_GAIN_POINTS = 0.5  # replay quality gain (points) a refit needs before it replaces the model in force


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "learn",
        parents=parents,
        help="refit the verifier (and classifier) from labels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--policy", required=True, type=Path, help="the policy in force (updated in place)")
    parser.add_argument("--since", default="30d", help="labels of requests since this age (default 30d)")
    parser.add_argument("--min-labels", type=int, default=50, help="fewer labelled requests: nothing is refitted")
    parser.add_argument(
        "--min-route-labels",
        type=int,
        default=200,
        help="labelled requests with pre-route features the classifier needs before it is refitted (default 200)",
    )
    parser.add_argument("--estimator", choices=["logistic", "boosting"], default="logistic")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    blend = parser.add_argument_group(
        "blending the shipped training data (--blend-shipped)",
        "Paired lines (query, documents, rag_pred, rag_score, lc_score) such as /work/shared/data/leval/paired.jsonl,"
        " their features computed as `selfroute train` computes them (cached under --data-dir), added to every"
        " refit's training data (never scored in the comparison), weighted to --blend-weight of the ledger labels.",
    )
    blend.add_argument("--blend-shipped", type=Path, default=None, help="paired training lines (JSON lines)")
    blend.add_argument("--blend-docs", type=Path, default=None, help="their documents' folder (<doc_id>.txt)")
    blend.add_argument("--blend-window-tokens", type=int, default=None, help="their long window (default: policy's)")
    blend.add_argument(
        "--blend-weight",
        type=float,
        default=1.0,
        help="total weight of the shipped lines as a multiple of the ledger labels' (default 1)",
    )
    parser.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    parser.add_argument("--json", action="store_true")
    add_ledger_argument(parser)
    parser.set_defaults(func=run)


def _weights(requests, shadow_rate: float) -> list[float]:
    out = []
    for r in requests:
        judged = [lab for lab in r.labels if lab["source"] != "feedback"]
        shadow = bool(judged) and judged[-1]["source"] == "shadow"
        out.append(1.0 / shadow_rate if shadow and shadow_rate > 0 else 1.0)
    return out


def replay_quality(scores, labels, weights, share: float) -> float:
    """Points: escalate the `share` least-trusted (weighted), the rest stand on their labels."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    total = sum(weights)
    budget, good = share * total, 0.0
    for i in order:
        if budget > 0:
            budget -= weights[i]
            good += weights[i]  # escalated: as good as long
        else:
            good += weights[i] * labels[i]
    return 100.0 * good / total if total else 0.0


@dataclass
class Labelled:
    """Training rows: the ledger's labelled requests first, then any blended shipped lines (never scored)."""

    rows: list[dict]
    labels: list[int]
    groups: list[str]
    weights: list[float]
    n_ledger: int


@dataclass
class Blend:
    """The shipped lines' features for both models, their labels and choice weights."""

    route_rows: list[dict]
    answer_rows: list[dict]
    labels: list[int]
    weights: list[float]
    groups: list[str]


def _blended(rows, labels, groups, weights, blend: Blend | None, blend_rows, blend_weight: float) -> Labelled:
    if blend is None:
        return Labelled(list(rows), list(labels), list(groups), list(weights), len(rows))
    # the shipped lines together weigh blend_weight times the ledger labels, in their own proportions
    scale = blend_weight * sum(weights) / (sum(blend.weights) or 1.0)
    return Labelled(
        [*rows, *blend_rows],
        [*labels, *blend.labels],
        [*groups, *(f"shipped:{g}" for g in blend.groups)],
        [*weights, *(w * scale for w in blend.weights)],
        len(rows),
    )


def _splits(data: Labelled, folds: int, seed: int):
    """Grouped folds over the ledger's labels; every fold also trains on all of the blended lines."""
    import numpy as np

    from classifier.training import grouped_folds

    n = data.n_ledger
    shipped = np.arange(n, len(data.rows))
    ledger_folds = grouped_folds(data.labels[:n], data.groups[:n], min(folds, len(set(data.groups[:n]))), seed)
    return [(np.concatenate([train, shipped]), test) for train, test in ledger_folds]


def _route_fit_predict(estimator, seed: int, x_train, y_train, w_train, x_test):
    """A pre-route pipeline (classifier.estimators, the shipped model's settings) fitted with the labels' weights."""
    import numpy as np

    from classifier.estimators import PRE_ROUTE, build_pipeline

    if len(set(y_train.tolist())) < 2:
        return None, np.full(len(x_test), float(y_train[0]) if len(y_train) else 0.5)
    pipeline = build_pipeline(estimator, PRE_ROUTE, seed).fit(x_train, y_train, model__sample_weight=w_train)
    return pipeline, pipeline.predict_proba(x_test)[:, list(pipeline.classes_).index(1)]


def _load_blend(args, policy, route_model) -> Blend:
    """The shipped lines' pre-route and answer features, computed with the gateway's code (as `selfroute train`)."""
    from classifier.training import label_from_scores
    from classifier.verifier import choice_weights
    from gateway.evaluation.examples import CorpusInputs, ExampleFileError, corpus_windows, load_corpora
    from gateway.evaluation.verification import answer_rows, cheap_answers
    from gateway.settings import resolve_data_dir

    examples = load_corpora([(args.blend_shipped, args.blend_docs)])
    for e in examples:
        if not all(k in e.record for k in ("rag_pred", "rag_score", "lc_score")):
            raise ExampleFileError(f"{args.blend_shipped}: blending needs rag_pred, rag_score and lc_score")
    data_dir = resolve_data_dir(args.data_dir)
    windows = corpus_windows(examples, [args.blend_window_tokens] if args.blend_window_tokens else None)
    builder = CorpusInputs(policy, data_dir / "lancedb", windows, cache_dir=data_dir / "cache")
    route_rows = [i.features for i in builder.all_inputs(examples, progress=False, with_long=False)]
    p_cheap = route_model.cheap_probabilities(route_rows) if route_model is not None else None
    rag = [float(e.record["rag_score"]) for e in examples]
    lc = [float(e.record["lc_score"]) for e in examples]
    return Blend(
        route_rows=route_rows,
        answer_rows=answer_rows(cheap_answers(builder, examples), p_cheap),
        labels=[label_from_scores(r, c) for r, c in zip(rag, lc)],
        weights=[float(w) for w in choice_weights(rag, lc)],
        groups=[e.group for e in examples],
    )


def run(args: argparse.Namespace) -> int:
    from classifier.model import ModelFileError
    from gateway.evaluation.examples import ExampleFileError
    from gateway.evaluation.recorded import RecordedReadError, read_recorded
    from policies.edit import set_values
    from policies.loader import PolicyError, parse_policy

    try:
        found = read_recorded(args.policy, ledger_location(args), args.since)
    except RecordedReadError as exc:
        print(f"selfroute learn: {exc}", file=sys.stderr)
        return 2
    policy, policy_file, verifier, requests = found.policy, found.policy_file, found.verifier, found.requests
    if verifier is None:
        print("selfroute learn: the policy needs routing.verifier", file=sys.stderr)
        return 2
    if (args.blend_shipped is None) != (args.blend_docs is None):
        print("selfroute learn: --blend-shipped and --blend-docs go together", file=sys.stderr)
        return 2
    labelled = [r for r in requests if r.label() is not None and r.features.get("verifier_features")]
    report: dict = {"requests": len(requests), "labelled": len(labelled), "written": None, "blended": 0}
    labels = [int(label) for r in labelled if (label := r.label()) is not None]  # every one of `labelled`
    if len(labelled) < args.min_labels or len(set(labels)) < 2:
        report["decision"] = (
            f"not refitted: {len(labelled)} labelled cheap answers (need {args.min_labels}, both good and not)"
        )
        return _print(args, report)
    blend = None
    if args.blend_shipped is not None:
        try:
            blend = _load_blend(args, policy, found.route_model)
        except (ExampleFileError, ModelFileError, OSError, ValueError) as exc:
            print(f"selfroute learn: {exc}", file=sys.stderr)
            return 2
        report["blended"] = len(blend.labels)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    edits: dict[str, dict] = {}  # routing section -> values to write
    models: list = []  # (save function, model, path) to write when the policy edit is good
    weights = _weights(labelled, policy.routing.learning.shadow_rate)
    verifier_part = _refit_verifier(args, policy, verifier, labelled, labels, weights, blend, stamp)
    report.update({k: v for k, v in verifier_part.items() if not k.startswith("_")})
    if "_write" in verifier_part:
        edits["verifier"], saved = verifier_part["_write"]
        models.append(saved)
    report["classifier"] = _refit_classifier(args, policy, found, labelled, labels, weights, blend, stamp)
    if "_write" in report["classifier"]:
        edits["classifier"], saved = report["classifier"].pop("_write")
        models.append(saved)
    if not edits:
        return _print(args, report)
    if args.dry_run:
        report["decision"] += " (dry run: nothing written)"
        return _print(args, report)
    text = policy_file.read_text(encoding="utf-8")
    for section, values in edits.items():
        text, _ = set_values(text, values, section)
    try:
        parse_policy(text, str(policy_file))  # never write a policy that would not load
    except PolicyError as exc:
        print(f"selfroute learn: the edited policy would not load: {exc}", file=sys.stderr)
        return 1
    for save, model, target in models:  # the new files first: the old ones stay where they are
        save(model, target)
    write_atomic(policy_file, text)  # a reload reads the old policy or the new one, never half
    if "verifier" in edits:
        report["written"] = str(policy_file.parent / edits["verifier"]["model_path"])
    if "classifier" in edits:
        report["classifier"]["written"] = str(policy_file.parent / edits["classifier"]["model_path"])
    return _print(args, report)


def _against_in_force(model: str, q_now: float, q_new: float) -> dict:
    """The refit's out-of-fold replay quality beside the model in force's; with a `decision` to keep the model in
    force when the refit gains less than MIN_GAIN_POINTS."""
    out: dict = {"quality_in_force": q_now, "quality_refit": q_new, "gain_points": q_new - q_now}
    if q_new < q_now + MIN_GAIN_POINTS:
        out["decision"] = (
            f"kept the {model} in force: the refit gains {q_new - q_now:+.2f} points (< {MIN_GAIN_POINTS})"
        )
    return out


def _refit_verifier(args, policy, verifier, labelled, labels, weights, blend, stamp) -> dict:
    """The verifier's out-of-fold comparison; `_write` holds the policy values and the model file when it is better."""
    import numpy as np

    from classifier.answer_features import ANSWER_FEATURE_NAMES
    from classifier.verifier import Split, protocol_scores, threshold_for_escalation_share, train_verifier
    from gateway.evaluation.recorded import _numbers
    from gateway.routing.model_files import save_verifier

    rows = [_numbers(r.features["verifier_features"]) for r in labelled]
    groups = [r.features.get("group") or r.id for r in labelled]
    names = [n for n in verifier.feature_names if n in ANSWER_FEATURE_NAMES] or list(ANSWER_FEATURE_NAMES)
    data = _blended(rows, labels, groups, weights, blend, blend.answer_rows if blend else None, args.blend_weight)
    splits = [Split(train, test, "fold") for train, test in _splits(data, args.folds, args.seed)]
    scored = protocol_scores(
        data.rows,
        np.asarray(data.labels),
        splits,
        estimator=args.estimator,
        seed=args.seed,
        feature_names=names,
        sample_weight=data.weights,
    )
    oof = [float(s) for s in scored[: data.n_ledger]]
    current = verifier.scores(rows)
    settings = policy.routing.verifier
    threshold = settings.threshold if settings is not None and settings.threshold is not None else verifier.threshold
    assert threshold is not None  # load_verifier_model refuses a verifier with neither
    share = sum(w for s, w in zip(current, weights) if s < threshold) / sum(weights)
    q_now, q_new = (replay_quality(s, labels, weights, share) for s in (current, oof))
    out: dict = {"escalated_share": share, **_against_in_force("verifier", q_now, q_new)}
    if "decision" in out:
        return out
    new_threshold = threshold_for_escalation_share(oof, share)
    blended = f", blended with {len(blend.labels)} lines of {args.blend_shipped.name}" if blend else ""
    result = train_verifier(
        data.rows,
        np.asarray(data.labels),
        data.groups,
        estimator=args.estimator,
        feature_names=names,
        sample_weight=data.weights,
        n_splits=min(args.folds, len(set(data.groups))),
        seed=args.seed,
        card={
            "trained_on": f"{len(labelled)} ledger labels since {args.since}{blended}",
            "threshold": new_threshold,
            "threshold_source": f"learn: escalates the in-force share {share:.1%} out of fold",
        },
    )
    target = Path(args.policy).parent / f"verifier-learned-{stamp}.skops"
    out.update(
        decision=f"refit is better by {q_new - q_now:+.2f} points", new_threshold=new_threshold, model_path=target.name
    )
    values = {
        "model_path": target.name,
        "threshold": float(new_threshold),
        "threshold_source": f"learn {stamp}: {len(labelled)} ledger labels{blended}, out-of-fold {q_new:.1f} vs {q_now:.1f}",
    }
    out["_write"] = (values, (save_verifier, result.model, target))
    return out


def _refit_classifier(args, policy, found, labelled, labels, weights, blend, stamp) -> dict:
    """The pre-route classifier's refit, when the policy has one and there are enough labels with its features."""
    import numpy as np

    from classifier.features import FEATURE_NAMES
    from classifier.model import RouteModel
    from classifier.training import feature_matrix
    from classifier.verifier import threshold_for_escalation_share
    from gateway.evaluation.recorded import _numbers
    from gateway.routing.model_files import save_model

    model, settings = found.route_model, policy.routing.classifier
    if model is None or settings is None:
        return {"decision": "the policy routes without a pre-route classifier: not refitted"}
    # the requests the classifier decided (no rule did), labelled
    keep = [i for i, r in enumerate(labelled) if r.features.get("features") and r.features.get("rule") is None]
    if len(keep) < args.min_route_labels or len({labels[i] for i in keep}) < 2:
        return {
            "labelled": len(keep),
            "decision": f"not refitted: {len(keep)} labelled requests the classifier decided (need "
            f"{args.min_route_labels}, both good and not)",
        }
    rows = [_numbers(labelled[i].features["features"]) for i in keep]
    y = [labels[i] for i in keep]
    w = [weights[i] for i in keep]
    groups = [labelled[i].features.get("group") or labelled[i].id for i in keep]
    data = _blended(rows, y, groups, w, blend, blend.route_rows if blend else None, args.blend_weight)
    x, yy, ww = feature_matrix(data.rows), np.asarray(data.labels, dtype=int), np.asarray(data.weights, dtype=float)
    oof = np.zeros(data.n_ledger)
    for train, test in _splits(data, args.folds, args.seed):
        oof[test] = _route_fit_predict(args.estimator, args.seed, x[train], yy[train], ww[train], x[test])[1]
    current = model.cheap_probabilities(rows)
    # the share of these answers the policy in force sent long after they were seen, now sent long up front
    share = sum(wi for i, wi in zip(keep, w) if labelled[i].features.get("escalated")) / sum(w)
    q_now, q_new = (replay_quality(list(s), y, w, share) for s in (current, oof))
    out: dict = {"labelled": len(keep), "long_share": share, **_against_in_force("classifier", q_now, q_new)}
    if "decision" in out:
        return out
    pipeline, _ = _route_fit_predict(args.estimator, args.seed, x, yy, ww, x[:1])
    # the new threshold keeps the share of recorded requests the classifier in force sent long
    decided = [r for r in found.requests if r.features.get("p_cheap") is not None and r.features.get("features")]
    long_before, new_threshold = 0.0, float(settings.threshold)  # nothing it decided recorded: the one in force
    if decided:
        recorded = [_numbers(r.features["features"]) for r in decided]
        long_before = sum(1 for r in decided if r.features["p_cheap"] < settings.threshold) / len(decided)
        scores = pipeline.predict_proba(feature_matrix(recorded))[:, list(pipeline.classes_).index(1)]
        new_threshold = float(threshold_for_escalation_share([float(p) for p in scores], long_before))
    blended = f", blended with {len(blend.labels)} lines of {args.blend_shipped.name}" if blend else ""
    target = Path(args.policy).parent / f"classifier-learned-{stamp}.skops"
    card = {
        "feature_names": FEATURE_NAMES,
        "estimator": args.estimator,
        "trained_on": f"{len(keep)} ledger labels since {args.since}{blended}",
        "learned_from": f"selfroute learn {stamp}: out-of-fold {q_new:.2f} vs {q_now:.2f} points in force",
        "threshold": new_threshold,
    }
    out.update(
        decision=f"refit is better by {q_new - q_now:+.2f} points", new_threshold=new_threshold, model_path=target.name
    )
    values = {
        "model_path": target.name,
        "threshold": new_threshold,
        "threshold_source": f"learn {stamp}: keeps the recorded long share {long_before:.1%}",
    }
    out["_write"] = (values, (save_model, RouteModel(pipeline, card), target))
    return out


def _print(args, report: dict) -> int:
    if args.json:
        print(json.dumps(report, indent=2, default=float))
        return 0
    print(f"{report['labelled']} labelled cheap answers in {report['requests']} recorded requests")
    if "quality_in_force" in report:
        print(
            f"out-of-fold replay at the in-force escalation share {report['escalated_share']:.1%}: "
            f"refit {report['quality_refit']:.2f} vs in force {report['quality_in_force']:.2f} points"
        )
    print(report["decision"])
    if report["written"]:
        print(f"wrote {report['written']} and pointed the policy's routing.verifier at it (the old model is kept)")
    classifier = report.get("classifier")
    if classifier:
        if "quality_in_force" in classifier:
            print(
                f"pre-route classifier, {classifier['labelled']} labelled requests, out of fold at long share "
                f"{classifier['long_share']:.1%}: refit {classifier['quality_refit']:.2f} vs in force "
                f"{classifier['quality_in_force']:.2f} points"
            )
        print(f"classifier: {classifier['decision']}")
        if classifier.get("written"):
            print(f"wrote {classifier['written']} and pointed routing.classifier at it (the old model is kept)")
    if report["blended"]:
        print(f"blended {report['blended']} shipped lines into every refit")
    return 0
