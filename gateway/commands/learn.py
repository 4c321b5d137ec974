"""`selfroute learn --policy P [--since 30d] [--dry-run]`: refit the answer verifier on the ledger's labels (the
pre-route classifier is not refitted yet), compare it out of fold with the model in force on those labels, and
only when it is better write a new model file beside the policy and point the policy at it (the old file is kept;
a gateway picks the policy up when it is restarted or reloaded).

The comparison: folds grouped by document (the features' `group`), each labelled request scored by a model fitted
without its document; the model in force scores the same requests as it is. Both escalate the same share of the
labelled cheap answers (the share the policy in force escalates on them), least trusted first; the replay quality is
the share of labelled requests whose answer is as good as the long route's (an escalated answer is; an accepted one
is when its label says so). Shadow labels stand for all accepted answers (weight 1 / shadow_rate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gateway.commands._common import add_ledger_argument, ledger_location

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
    parser.add_argument("--estimator", choices=["logistic", "boosting"], default="logistic")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
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


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from classifier.answer_features import ANSWER_FEATURE_NAMES
    from classifier.verifier import out_of_fold_scores, threshold_for_escalation_share, train_verifier
    from gateway.evaluation.recorded import RecordedReadError, _numbers, read_recorded
    from gateway.routing.model_files import save_verifier
    from policies.edit import set_values
    from policies.loader import PolicyError, parse_policy

    try:
        found = read_recorded(args.policy, ledger_location(args), args.since)
    except RecordedReadError as exc:
        print(f"selfroute learn: {exc}", file=sys.stderr)
        return 2
    policy, policy_file, verifier, requests = found.policy, found.policy_file, found.verifier, found.requests
    if verifier is None or policy_file is None:
        print("selfroute learn: the policy needs routing.verifier and a file to write to", file=sys.stderr)
        return 2
    labelled = [r for r in requests if r.label() is not None and r.features.get("verifier_features")]
    report: dict = {"requests": len(requests), "labelled": len(labelled), "written": None}
    labels = [int(label) for r in labelled if (label := r.label()) is not None]  # every one of `labelled`
    if len(labelled) < args.min_labels or len(set(labels)) < 2:
        report["decision"] = (
            f"not refitted: {len(labelled)} labelled cheap answers (need {args.min_labels}, both good and not)"
        )
        return _print(args, report)
    rows = [_numbers(r.features["verifier_features"]) for r in labelled]
    groups = [r.features.get("group") or r.id for r in labelled]
    weights = _weights(labelled, policy.routing.learning.shadow_rate)
    names = [n for n in verifier.feature_names if n in ANSWER_FEATURE_NAMES] or list(ANSWER_FEATURE_NAMES)
    y = np.asarray(labels)
    oof = [
        float(s)
        for s in out_of_fold_scores(
            rows,
            y,
            groups,
            estimator=args.estimator,
            n_splits=min(args.folds, len(set(groups))),
            seed=args.seed,
            feature_names=names,
            sample_weight=weights,
        )
    ]
    current = verifier.scores(rows)
    settings = policy.routing.verifier
    threshold = settings.threshold if settings is not None and settings.threshold is not None else verifier.threshold
    assert threshold is not None  # load_verifier_model refuses a verifier with neither
    share = sum(w for s, w in zip(current, weights) if s < threshold) / sum(weights)
    q_now, q_new = (replay_quality(s, labels, weights, share) for s in (current, oof))
    report.update(escalated_share=share, quality_in_force=q_now, quality_refit=q_new, gain_points=q_new - q_now)
    if q_new < q_now + MIN_GAIN_POINTS:
        report["decision"] = (
            f"kept the model in force: the refit gains {q_new - q_now:+.2f} points (< {MIN_GAIN_POINTS})"
        )
        return _print(args, report)
    new_threshold = threshold_for_escalation_share(oof, share)
    result = train_verifier(
        rows,
        y,
        groups,
        estimator=args.estimator,
        feature_names=names,
        sample_weight=weights,
        n_splits=min(args.folds, len(set(groups))),
        seed=args.seed,
        card={
            "trained_on": f"{len(labelled)} ledger labels since {args.since}",
            "threshold": new_threshold,
            "threshold_source": f"learn: escalates the in-force share {share:.1%} out of fold",
        },
    )
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target = policy_file.parent / f"verifier-learned-{stamp}.skops"
    report.update(
        decision=f"refit is better by {q_new - q_now:+.2f} points", new_threshold=new_threshold, model_path=target.name
    )
    if args.dry_run:
        report["decision"] += " (dry run: nothing written)"
        return _print(args, report)
    save_verifier(result.model, target)
    text, _ = set_values(
        policy_file.read_text(encoding="utf-8"),
        {
            "model_path": target.name,
            "threshold": float(new_threshold),
            "threshold_source": f"learn {stamp}: {len(labelled)} ledger labels, out-of-fold {q_new:.1f} vs {q_now:.1f}",
        },
        "verifier",
    )
    try:
        parse_policy(text, str(policy_file))  # never write a policy that would not load
    except PolicyError as exc:
        print(f"selfroute learn: the edited policy would not load: {exc}", file=sys.stderr)
        return 1
    policy_file.write_text(text, encoding="utf-8")
    report["written"] = str(target)
    return _print(args, report)


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
    return 0
