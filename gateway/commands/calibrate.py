"""`selfroute calibrate`: set the routing thresholds from a target.

--target-long-share S sets the classifier threshold so a share S of requests goes long.
--max-cost-share X / --min-quality-delta D set the classifier threshold and the verifier threshold
together, replaying paired answers (lines with rag_pred, rag_score, lc_score and --docs): the setting
with the best replay quality whose cost is at most X of always-long's, or the cheapest setting whose
quality is at least always-long's + D points. Every score is out of fold (--protocol grouped: k folds by
document; loto: leave one task out), the same as `selfroute eval replay`; the chosen setting's replay
figures are printed and written into the policy's threshold_source. With --prompt-cache on (or
--long-cache-prices) every setting's long legs, and always-long's, are priced with the long model's prompt
cache, as `selfroute eval replay` prices them: the cost share, and so the chosen thresholds, are those of
a workload whose questions on a document come one after another.

For --target-long-share the probabilities must come from data the model was not fitted on, or the share
drifts in use (a model is more confident on its own training examples). Two sources qualify:
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

from gateway.commands._common import add_cache_arguments, add_ledger_argument, cache_options, ledger_location
from gateway.files import write_atomic


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        parents=parents,
        help="set the classifier threshold so a target share of requests goes to the long route",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="out-of-fold predictions (lines with p_cheap) or held-out examples (JSON lines); not with --from-ledger",
    )
    parser.add_argument("--docs", type=Path, default=None, help="folder of <doc_id>.txt for held-out examples")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--target-long-share", type=float, help="share routed long, 0..1 (classifier threshold)")
    target.add_argument(
        "--max-cost-share",
        type=float,
        help="best replay quality with cost <= this share of always-long (both thresholds)",
    )
    target.add_argument(
        "--min-quality-delta",
        type=float,
        help="cheapest setting with replay quality >= always-long + this many points, e.g. 1.0 (both thresholds)",
    )
    parser.add_argument("--policy", required=True, type=Path, help="policy YAML to update in place")
    parser.add_argument("--dry-run", action="store_true", help="print the threshold, do not write the policy")
    replay = parser.add_argument_group("replay targets (--max-cost-share, --min-quality-delta)")
    replay.add_argument(
        "--protocol",
        choices=["grouped", "loto"],
        default="grouped",
        help="out-of-fold scores: grouped = k folds by document, loto = leave one task out",
    )
    replay.add_argument("--folds", type=int, default=5)
    replay.add_argument("--seed", type=int, default=0)
    replay.add_argument("--estimator", choices=["logistic", "boosting"], default="boosting")
    replay.add_argument("--window-tokens", type=int, default=None, help="long route window (16385 for L-Eval)")
    replay.add_argument(
        "--prices",
        choices=["auto", "policy", "reference"],
        default="auto",
        help="auto: the policy's models' prices (the policy's, else litellm's cost map) when non-zero, "
        "else the reference pair gpt-3.5-turbo / gpt-3.5-turbo-16k",
    )
    replay.add_argument(
        "--relative-units",
        choices=["task", "model"],
        default="task",
        help="with a policy whose verifier sets `relative`: the held-out units (one key each) its parameters are "
        "chosen across, through the live check, the chosen thresholds deciding each key's warm-up",
    )
    replay.add_argument(
        "--relative-token-share",
        type=float,
        default=0.3,
        help="the relative rule's target per unit: within 1 point of the better of always-long and always-RAG at "
        "<= this share of always-long's tokens (and above Self-Route at no more tokens)",
    )
    add_cache_arguments(replay)
    replay.add_argument(
        "--fixed-classifier",
        action="store_true",
        help="keep the policy's classifier threshold; tune only the verifier's",
    )
    ledger = parser.add_argument_group("from the ledger (--from-ledger --max-cost-share X)")
    ledger.add_argument(
        "--from-ledger",
        action="store_true",
        help="set the verifier threshold from the recorded P(good) of routed requests (no labels): the "
        "most escalations with the estimated cost <= --max-cost-share of always-long",
    )
    ledger.add_argument("--since", default="7d", help="recorded requests since this age (default 7d)")
    add_ledger_argument(ledger)
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
    if args.from_ledger:
        return run_from_ledger(args)
    if args.data is None:
        print("selfroute calibrate: --data is required (or --from-ledger)", file=sys.stderr)
        return 2
    if args.target_long_share is None:
        return run_replay_target(args)
    from classifier.calibration import calibrate_threshold, long_share
    from policies.edit import set_threshold
    from policies.loader import PolicyError, load_policy

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
    print(
        f"threshold {threshold:.4f}: {achieved:.1%} of {len(probabilities)} requests go long "
        f"(target {args.target_long_share:.1%})"
    )
    if skipped:
        print(f"skipped {skipped} examples whose documents the model was trained on")
    if args.dry_run:
        return 0
    text = policy_file.read_text(encoding="utf-8")
    updated, comments_kept = set_threshold(text, threshold, source)
    return write_policy(policy_file, updated, comments_kept, "routing.classifier.threshold", "routing.classifier")


def run_replay_target(args: argparse.Namespace) -> int:
    from classifier.model import ModelFileError
    from gateway.commands._common import print_relative
    from gateway.evaluation.examples import ExampleFileError, RouteInputBuilder, load_examples
    from gateway.evaluation.prices import resolve_prices
    from gateway.evaluation.report import build_items
    from gateway.evaluation.tradeoff import choose, relative_choice_card
    from gateway.evaluation.verification import replay_scores
    from gateway.settings import resolve_data_dir
    from pipelines.unanswerable import UnanswerableDetector
    from policies.edit import set_threshold, set_values
    from policies.loader import PolicyError, load_policy

    if args.max_cost_share is not None and not 0.0 < args.max_cost_share:
        print("selfroute calibrate: --max-cost-share must be above 0", file=sys.stderr)
        return 2
    try:
        policy, policy_file = load_policy(args.policy)
        examples = load_examples(args.data, args.docs)
        for e in examples:
            if not all(k in e.record for k in ("rag_pred", "rag_score", "lc_score")):
                raise ExampleFileError(
                    f"{args.data}: a replay target needs rag_pred, rag_score and lc_score on every line"
                )
        prices = resolve_prices(policy, args.prices, **cache_options(args))
        data_dir = resolve_data_dir(args.data_dir)
        builder = RouteInputBuilder(
            policy, data_dir / "lancedb", window_tokens=args.window_tokens, cache_dir=data_dir / "cache"
        )
        inputs = builder.all_inputs(examples, progress=False)
        probabilities, scores, _ = replay_scores(
            policy,
            policy_file,
            examples,
            inputs,
            builder,
            protocol=args.protocol,
            estimator=args.estimator,
            folds=args.folds,
            seed=args.seed,
            verifier_threshold=0.5,
        )
        items = build_items(
            examples, inputs, probabilities, UnanswerableDetector(policy.rag.unanswerable_patterns), scores
        )
        pick = choose(
            items,
            policy,
            prices,
            max_cost_share=args.max_cost_share,
            min_quality_delta=args.min_quality_delta,
            tune_pre_route=not args.fixed_classifier,
        )
    except (PolicyError, ExampleFileError, ModelFileError, OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"selfroute calibrate: {exc}", file=sys.stderr)
        return 2
    target = (
        f"cost <= {args.max_cost_share:g} of always-long"
        if args.max_cost_share is not None
        else f"quality >= always-long {args.min_quality_delta:+g} points"
    )
    cache = prices.long_cache
    if cache is not None:  # the cost share holds for a workload that keeps the long model's cache warm
        target += (
            f" with a warm prompt cache (read {cache.read:g}/M"
            + (f", write {cache.write:g}/M" if cache.write is not None else "")
            + (f", {cache.window}-question window" if cache.window is not None else "")
            + ")"
        )
    protocol = "leave-one-task-out" if args.protocol == "loto" else f"grouped {args.folds}-fold"
    figures = (
        f"{pick.quality_vs_long_points:+.2f} points vs always-long at {pick.cost_vs_long:.3f} of its cost, "
        f"{pick.long_share:.1%} long or escalated"
    )
    source = f"calibrate: {target} on the {protocol} replay of {len(items)} answers in {args.data.name}: {figures}"
    verifier_on = scores is not None
    print(
        ("" if pick.met else "target not met; the closest setting: ")
        + (f"classifier threshold {pick.pre_threshold:.4f}" if pick.pre_threshold is not None else "no classifier")
        + (f", verifier threshold {pick.verifier_threshold:.4f}" if verifier_on else ", no verifier")
        + (f", refusal threshold {pick.refusal_threshold:.4f}" if verifier_on and pick.refusal_threshold else "")
        + f": {figures} ({protocol} replay)"
    )
    if not pick.met:
        print("the policy is left as it was", file=sys.stderr)
        return 1
    relative = None
    if verifier_on and policy.routing.verifier is not None and policy.routing.verifier.relative is not None:
        # the relative rule's parameters across the held-out units, the thresholds just chosen deciding its warm-up
        warm_up = policy.model_copy(deep=True)
        warm_up.routing.verifier.threshold = pick.verifier_threshold  # type: ignore[union-attr]
        warm_up.routing.verifier.refusal_threshold = pick.refusal_threshold  # type: ignore[union-attr]
        units = [e.task or "" for e in examples] if args.relative_units == "task" else [e.model for e in examples]
        relative = relative_choice_card(
            items,
            units,
            warm_up,
            max_token_share=args.relative_token_share,
            command=f"calibrate ({protocol} replay of {args.data.name}, units: {args.relative_units})",
        )
        print_relative(relative)
    if args.dry_run:
        return 0
    text = policy_file.read_text(encoding="utf-8")
    comments_kept = True
    if pick.pre_threshold is not None and not args.fixed_classifier:
        text, kept = set_threshold(text, pick.pre_threshold, source, "classifier")
        comments_kept &= kept
    if verifier_on:
        text, kept = set_threshold(text, pick.verifier_threshold, source, "verifier")
        comments_kept &= kept
        if pick.refusal_threshold is not None:
            text, kept = set_values(text, {"refusal_threshold": pick.refusal_threshold}, "verifier")
            comments_kept &= kept
        if relative is not None:
            chosen = relative["settings"]
            text, kept = (
                set_values(text, {**chosen, "source": relative["source"]}, "verifier.relative")
                if chosen is not None
                else set_values(text, {"relative": None}, "verifier")  # the fixed thresholds did best
            )
            comments_kept &= kept
    return write_policy(policy_file, text, comments_kept, "the thresholds", "a routing block")


def run_from_ledger(args: argparse.Namespace) -> int:
    """The verifier threshold from the recorded score distribution (gateway.evaluation.recorded)."""
    from gateway.evaluation.recorded import RecordedReadError, read_recorded, thresholds_for_cost_share
    from policies.edit import set_threshold

    if args.max_cost_share is None or not 0 < args.max_cost_share <= 1:
        print("selfroute calibrate: --from-ledger needs --max-cost-share within (0, 1]", file=sys.stderr)
        return 2
    try:
        found = read_recorded(args.policy, ledger_location(args), args.since, models=False, own_requests=True)
    except RecordedReadError as exc:
        print(f"selfroute calibrate: {exc}", file=sys.stderr)
        return 2
    policy, policy_file, requests = found.policy, found.policy_file, found.requests
    pick = thresholds_for_cost_share(requests, args.max_cost_share)
    if pick is None:
        print(
            f"selfroute calibrate: no request of policy {policy.name!r} since {args.since} was checked by the "
            "verifier: nothing to calibrate on",
            file=sys.stderr,
        )
        return 1
    threshold, figures = pick
    print(
        f"verifier threshold {threshold:.4f}: escalates {figures['escalated_share']:.1%} of {figures['checked']} "
        f"checked answers; estimated cost {figures['cost_share']:.1%} of always-long over {len(requests)} recorded "
        f"requests (target <= {args.max_cost_share:.1%})"
    )
    if args.dry_run:
        return 0
    source = (
        f"calibrate --from-ledger: {len(requests)} requests since {args.since}, estimated cost "
        f"{figures['cost_share']:.3f} <= {args.max_cost_share} of always-long"
    )
    text, kept = set_threshold(policy_file.read_text(encoding="utf-8"), threshold, source, "verifier")
    return write_policy(policy_file, text, kept, "routing.verifier.threshold", "routing.verifier")


def write_policy(policy_file: Path, text: str, comments_kept: bool, written: str, block: str) -> int:
    """Write the edited policy, unless it would not load; say what was written and whether `block` lost comments."""
    from policies.loader import PolicyError, parse_policy

    try:
        parse_policy(text, str(policy_file))  # never write a policy that would not load
    except PolicyError as exc:
        print(f"selfroute calibrate: the edited policy would not load: {exc}", file=sys.stderr)
        return 1
    write_atomic(policy_file, text)  # a gateway reloading reads the old policy or the new one, never half
    note = "" if comments_kept else f" (rewritten: {block} was not a block mapping, comments lost)"
    print(f"wrote {written} to {policy_file}{note}")
    return 0
