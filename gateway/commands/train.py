"""`selfroute train`: fit the routing classifier on labelled examples and write model + card."""
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
    return " ".join(shlex.quote(p) for p in parts)


def _f(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
