"""`selfroute train`: fit the routing classifier (or, with --verifier, the answer verifier) on labelled
examples and write model + card."""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "train",
        parents=parents,
        help="train the routing classifier P(cheap route suffices)",
        description=(
            "Train the routing classifier. Each JSON line has a query, its documents (doc_id -> DIR/<doc_id>.txt, "
            "or `documents`: ids or inline {id, text}) and a label (1 = the cheap route suffices) or rag_score and "
            "lc_score. Features are computed with the gateway's own code, including a retrieval pass over a "
            "LanceDB store under --data-dir."
        ),
    )
    parser.add_argument("--data", required=True, type=Path, help="examples, JSON lines")
    parser.add_argument("--docs", type=Path, default=None, help="folder of <doc_id>.txt documents")
    parser.add_argument("--out", required=True, type=Path, help="model file to write (.skops; the card goes beside it)")
    parser.add_argument("--policy", type=Path, default=None, help="policy whose RAG settings compute the features")
    parser.add_argument("--label-field", default="label", help="field holding a 0/1 label (default: label)")
    parser.add_argument(
        "--score-margin", type=float, default=0.0,
        help="without a label: cheap suffices when rag_score >= lc_score - margin (default 0: ties go cheap)",
    )
    parser.add_argument("--estimator", choices=["logistic", "boosting"], default="boosting",
                        help="boosting: gradient-boosted trees (the shipped model); logistic: a linear model")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds, grouped by document")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--oof-out", type=Path, default=None,
                        help="also write out-of-fold P(cheap) per example (JSON lines) for `selfroute calibrate`")
    verifier = parser.add_argument_group(
        "answer verifier (--verifier)",
        "Fit the verifier of cheap answers instead: paired lines with rag_pred, rag_score and lc_score. Features "
        "are computed as the gateway computes them (our retrieval's passages for the question, the document's "
        "terms, classifier.answer_features); label: rag_score >= lc_score - margin; each example weighted by "
        "|rag_score - lc_score| (ties 0.05). The card's threshold is the best replay quality under "
        "--max-cost-share, on out-of-fold scores (--threshold-protocol).")
    verifier.add_argument("--verifier", action="store_true", help="train the answer verifier")
    verifier.add_argument("--max-cost-share", type=float, default=0.45,
                          help="the card's threshold: best replay quality with cost <= this share of always-long "
                               "(default 0.45)")
    verifier.add_argument("--threshold-protocol", choices=["loto", "grouped"], default="loto",
                          help="out-of-fold scores the threshold is chosen on: loto = leave one task out (the lines' "
                               "`task`; the setting for a new workload, default), grouped = k-fold by document")
    verifier.add_argument("--window-tokens", type=int, default=None,
                          help="long route window for the replay's costs (default: the policy's; 16385 for L-Eval)")
    verifier.add_argument("--prices", choices=["auto", "policy", "reference"], default="auto",
                          help="prices of the replay's costs (as `selfroute eval replay`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.verifier:
        return run_verifier(args)
    from classifier.model import RouteModel
    from gateway.routing.model_files import save_model
    from classifier.training import LABEL_RULE, data_hash, document_hash, model_card, train
    from gateway.evaluation.examples import ExampleFileError, RouteInputBuilder, example_label, load_examples
    from gateway.settings import resolve_data_dir
    from policies.loader import PolicyError, load_policy

    try:
        policy, policy_file = load_policy(args.policy)
        examples = load_examples(args.data, args.docs)
        labels = [example_label(e, args.label_field, args.score_margin) for e in examples]
    except (PolicyError, ExampleFileError, OSError) as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    if args.estimator == "boosting" and len(examples) < 200:
        print(f"note: {len(examples)} examples are few for boosted trees (leaves need 30 examples); "
              "consider --estimator logistic", file=sys.stderr)
    data_dir = resolve_data_dir(args.data_dir)
    builder = RouteInputBuilder(policy, data_dir / "lancedb", cache_dir=data_dir / "cache")
    rows = [i.features for i in builder.all_inputs(examples, with_long=False)]
    groups = [e.group for e in examples]
    try:
        result = train(rows, labels, groups, args.estimator, args.folds, args.seed)
    except ValueError as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    records = [
        {"query": e.query, "documents": [[d.id, document_hash(d.text)] for d in e.documents], "label": y, "group": e.group}
        for e, y in zip(examples, labels)
    ]
    uses_scores = any(args.label_field not in e.record for e in examples)
    rule = (LABEL_RULE.replace("margin", f"{args.score_margin:g}") if uses_scores else f"field {args.label_field!r}")
    card = model_card(
        result,
        estimator=args.estimator,
        data_sha=data_hash(records),
        label_rule=rule,
        command=_command(args),
        extra={
            "training_examples": len(examples),
            "training_documents": len(set(groups)),
            # lets `selfroute calibrate` skip examples the model was fitted on
            "training_document_hashes": sorted({document_hash(d.text) for e in examples for d in e.documents}),
            "rag_settings": policy.rag.model_dump(mode="json"),
            "policy": str(args.policy) if args.policy else "the shipped default policy",
        },
    )
    save_model(RouteModel(result.pipeline, card), args.out)
    if args.oof_out:
        with args.oof_out.open("w", encoding="utf-8") as out:
            for e, y, p in zip(examples, labels, result.oof_probabilities):
                out.write(json.dumps({"group": e.group, "query": e.query, "label": y, "p_cheap": p}) + "\n")
    metrics = result.cv_metrics
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    print(
        f"cross-validated by document ({metrics['n_splits']} folds, {metrics['n_documents']} documents, "
        f"{metrics['n']} examples): ROC AUC {_f(metrics['roc_auc'])}, accuracy {_f(metrics['accuracy'])} "
        f"(majority {_f(metrics['majority_accuracy'])}), Brier {_f(metrics['brier'])} "
        f"(base rate {_f(metrics['brier_base_rate'])})"
    )
    return 0


def run_verifier(args: argparse.Namespace) -> int:
    import numpy as np

    from classifier.answer_features import ANSWER_FEATURE_NAMES
    from classifier.training import data_hash, document_hash, library_versions
    from classifier.verifier import (
        LABEL_RULE, choice_weights, label_good, leave_one_group_out_scores, train_verifier,
    )
    from gateway.evaluation.examples import ExampleFileError, RouteInputBuilder, load_examples
    from gateway.evaluation.prices import resolve_prices
    from gateway.evaluation.report import build_items
    from gateway.evaluation.replay import without_pre_route
    from gateway.evaluation.tradeoff import choose
    from gateway.evaluation.verification import answer_rows, cheap_answers
    from gateway.routing.model_files import save_verifier
    from gateway.settings import resolve_data_dir
    from pipelines.unanswerable import UnanswerableDetector
    from policies.loader import PolicyError, load_policy

    try:
        policy, _ = load_policy(args.policy)
        examples = load_examples(args.data, args.docs)
        for e in examples:
            if not all(k in e.record for k in ("rag_pred", "rag_score", "lc_score")):
                raise ExampleFileError(f"{args.data}: --verifier needs rag_pred, rag_score and lc_score on every line")
        prices = resolve_prices(policy, args.prices)
    except (PolicyError, ExampleFileError, OSError, ValueError, RuntimeError) as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    tasks = [str(e.record.get("task") or "") for e in examples]
    if args.threshold_protocol == "loto" and len(set(tasks)) < 2:
        print("selfroute train: --threshold-protocol loto needs a `task` field with at least two tasks",
              file=sys.stderr)
        return 2
    data_dir = resolve_data_dir(args.data_dir)
    builder = RouteInputBuilder(policy, data_dir / "lancedb", window_tokens=args.window_tokens,
                                cache_dir=data_dir / "cache")
    inputs = builder.all_inputs(examples)
    rows = answer_rows(cheap_answers(builder, examples, progress=True))
    rag = [float(e.record["rag_score"]) for e in examples]
    lc = [float(e.record["lc_score"]) for e in examples]
    labels = np.array([label_good(r, c, args.score_margin) for r, c in zip(rag, lc)])
    weights = choice_weights(rag, lc)
    groups = [e.group for e in examples]
    names = [n for n in ANSWER_FEATURE_NAMES if n != "pre_route_probability"]
    try:
        result = train_verifier(rows, labels, groups, estimator=args.estimator, feature_names=names,
                                sample_weight=weights, n_splits=args.folds, seed=args.seed)
        if args.threshold_protocol == "loto":
            oof = leave_one_group_out_scores(rows, labels, tasks, estimator=args.estimator, seed=args.seed,
                                             feature_names=names, sample_weight=weights)
        else:
            oof = result.oof_scores
    except ValueError as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    detector = UnanswerableDetector(policy.rag.unanswerable_patterns)
    items = build_items(examples, inputs, [1.0] * len(examples), detector, oof)
    pick = choose(items, without_pre_route(policy), prices, max_cost_share=args.max_cost_share,
                  tune_pre_route=False)
    protocol = "leave-one-task-out" if args.threshold_protocol == "loto" else f"grouped {args.folds}-fold"
    model = result.model
    model.card.update({
        "threshold": pick.verifier_threshold,
        "threshold_source": (
            f"train: best replay quality with cost <= {args.max_cost_share:g} of always-long on {protocol} "
            f"out-of-fold P(good) of {len(examples)} answers (every answer checked, no pre-route): quality "
            f"{pick.quality_vs_long_points:+.2f} points vs always-long at {pick.cost_vs_long:.3f} of its cost, "
            f"{pick.long_share:.1%} escalated" + ("" if pick.met else "; no threshold met the cap, the cheapest kept")),
        "label_rule": LABEL_RULE.replace("margin", f"{args.score_margin:g}"),
        "sample_weight": "|rag_score - lc_score|, ties 0.05",
        "training_data_hash": data_hash([{"query": e.query, "documents": [[d.id, document_hash(d.text)]
                                           for d in e.documents], "rag_pred": e.record["rag_pred"], "label": int(y)}
                                         for e, y in zip(examples, labels)]),
        "training_examples": len(examples),
        "training_documents": len(set(groups)),
        "training_tasks": sorted(set(tasks) - {""}),
        "prices": prices.__dict__,
        "long_window_tokens": builder.window,
        "library_versions": library_versions(),
        "rag_settings": policy.rag.model_dump(mode="json"),
        "training_command": _command(args),
    })
    save_verifier(model, args.out)
    metrics = result.cv_metrics
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    print(f"cross-validated by document ({metrics['n_splits']} folds, {metrics['n_groups']} documents, "
          f"{metrics['n']} answers): ROC AUC {_f(metrics['roc_auc'])}, accuracy {_f(metrics['accuracy'])}")
    print(f"threshold {pick.verifier_threshold:.4f}: {pick.quality_vs_long_points:+.2f} points vs always-long at "
          f"{pick.cost_vs_long:.3f} of its cost, {pick.long_share:.1%} escalated ({protocol} out-of-fold scores"
          + ("" if pick.met else f"; nothing met --max-cost-share {args.max_cost_share:g}") + ")")
    return 0


def _command(args: argparse.Namespace) -> str:
    """The training command as it could be typed again (rebuilt from the parsed options)."""
    parts = ["selfroute", "train", "--data", str(args.data)]
    if args.docs is not None:
        parts += ["--docs", str(args.docs)]
    parts += ["--out", str(args.out)]
    if args.policy is not None:
        parts += ["--policy", str(args.policy)]
    if args.label_field != "label":
        parts += ["--label-field", args.label_field]
    if args.score_margin:
        parts += ["--score-margin", f"{args.score_margin:g}"]
    parts += ["--estimator", args.estimator, "--folds", str(args.folds), "--seed", str(args.seed)]
    if args.verifier:
        parts += ["--verifier", "--max-cost-share", f"{args.max_cost_share:g}",
                  "--threshold-protocol", args.threshold_protocol, "--prices", args.prices]
        if args.window_tokens:
            parts += ["--window-tokens", str(args.window_tokens)]
    return " ".join(shlex.quote(p) for p in parts)


def _f(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
