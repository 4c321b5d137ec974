"""`selfroute calibrate`: set the classifier threshold so a target share of requests goes long.

The probabilities must come from data the model was not fitted on, or the share drifts in use (a
model is more confident on its own training examples). Two sources qualify:
- out-of-fold predictions: lines with `p_cheap`, as written by `selfroute train --oof-out` (every
  probability there comes from a fold model that never saw that example's document);
- held-out examples (query + documents, as for train): scored with the policy's model. Examples whose
  documents all appear in the model card's training documents are skipped, and the count is printed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        parents=parents,
        help="set the classifier threshold so a target share of requests goes to the long route",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", required=True, type=Path,
                        help="out-of-fold predictions (lines with p_cheap) or held-out examples (JSON lines)")
    parser.add_argument("--docs", type=Path, default=None, help="folder of <doc_id>.txt for held-out examples")
    parser.add_argument("--target-long-share", required=True, type=float, help="share routed long, 0..1")
    parser.add_argument("--policy", required=True, type=Path, help="policy YAML to update in place")
    parser.add_argument("--dry-run", action="store_true", help="print the threshold, do not write the policy")
    parser.set_defaults(func=run)


def _oof_probabilities(path: Path) -> list[float] | None:
    """The p_cheap column when every line has one; None for an examples file."""
    values = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                if "p_cheap" not in record:
                    return None
                values.append(float(record["p_cheap"]))
    return values


def _held_out_probabilities(args, policy, policy_file) -> tuple[list[float], int]:
    from classifier.training import document_hash

    from gateway.evaluation.examples import RouteInputBuilder, load_examples
    from gateway.routing.model_files import load_route_model
    from gateway.settings import resolve_data_dir

    model = load_route_model(policy, policy_file)
    if model is None:
        raise ValueError("the policy has no classifier to calibrate")
    trained = set(model.card.get("training_document_hashes") or [])
    examples = load_examples(args.data, args.docs)

    def seen(example) -> bool:
        return all(document_hash(d.text) in trained for d in example.documents)

    held_out = [e for e in examples if not seen(e)]
    skipped = len(examples) - len(held_out)
    if not held_out:
        raise ValueError("every example's documents were in the model's training data; calibrate on held-out data")
    data_dir = resolve_data_dir(args.data_dir)
    builder = RouteInputBuilder(policy, data_dir / "lancedb", cache_dir=data_dir / "cache")
    rows = [i.features for i in builder.all_inputs(held_out, with_long=False)]
    return model.cheap_probabilities(rows), skipped


def run(args: argparse.Namespace) -> int:
    from classifier.calibration import calibrate_threshold, long_share
    from policies.edit import set_threshold
    from policies.loader import PolicyError, load_policy, parse_policy

    if not 0.0 <= args.target_long_share <= 1.0:
        print("selfroute calibrate: --target-long-share must be within 0..1", file=sys.stderr)
        return 2
    try:
        policy, policy_file = load_policy(args.policy)
        probabilities = _oof_probabilities(args.data)
        if probabilities is not None:
            kind, skipped = "out-of-fold P(cheap)", 0
        else:
            probabilities, skipped = _held_out_probabilities(args, policy, policy_file)
            kind = "held-out P(cheap) from the policy's model"
        threshold = calibrate_threshold(probabilities, args.target_long_share)
    except (PolicyError, OSError, ValueError, KeyError) as exc:
        print(f"selfroute calibrate: {exc}", file=sys.stderr)
        return 2
    achieved = long_share(probabilities, threshold)
    source = (
        f"calibrate: quantile of {len(probabilities)} {kind} in {args.data.name} "
        f"for long share {args.target_long_share:.2f} (achieved {achieved:.3f})"
    )
    print(f"threshold {threshold:.4f}: {achieved:.1%} of {len(probabilities)} requests go long "
          f"(target {args.target_long_share:.1%})")
    if skipped:
        print(f"skipped {skipped} examples whose documents the model was trained on")
    if args.dry_run:
        return 0
    text = policy_file.read_text(encoding="utf-8")
    updated, comments_kept = set_threshold(text, threshold, source)
    try:
        parse_policy(updated, str(policy_file))  # never write a policy that would not load
    except PolicyError as exc:
        print(f"selfroute calibrate: the edited policy would not load: {exc}", file=sys.stderr)
        return 1
    policy_file.write_text(updated, encoding="utf-8")
    note = "" if comments_kept else " (rewritten: routing.classifier was not a block mapping, comments lost)"
    print(f"wrote routing.classifier.threshold to {policy_file}{note}")
    return 0
