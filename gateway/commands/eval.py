"""`selfroute eval`: offline evaluation of routing.

prepare-leval  convert L-Eval's paired RAG-vs-long answers into the paired replay format
replay         replay strategies over recorded answers of both routes (no model is called)
absent         measure the keep-refusal option on truly unanswerable questions (SQuAD 2.0)
live           send questions through a running gateway, score the answers, read costs from its ledger
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from classifier.estimators import ESTIMATORS
from gateway.commands import _simulate as simulate
from gateway.commands._common import add_cache_arguments, cache_options
from gateway.evaluation import live as eval_live

REPLAY_NOTES = """\
Paired data: JSON lines with doc_id, query, rag_score, lc_score (0..1), rag_pred, lc_pred, and optional
task, gt, group; documents are DIR/<doc_id>.txt. Strategies take the recorded score of the route they pick.
Fallback: RAG first, then long when the recorded RAG answer declares itself unanswerable (policy patterns);
both legs are paid. A rule's "direct" route has no recorded answer: it is scored with the worse of the two
recorded scores and costs the whole context at the cheap price. The classifier is scored only on documents
it was not trained on: P(cheap) comes from models retrained per fold (--protocol grouped: k folds by
document, fixed seed; loto: leave one task out), unless --model gives a trained model, replayed as is.
The verifier (--verifier FILE, or the policy's routing.verifier refitted per fold like the classifier)
scores each recorded RAG answer from the passages our retrieval sends and the document's terms; a
strategy escalates a RAG answer whose P(good) is below the verifier threshold (--verifier-threshold,
else the policy's, else the model card's), both legs paid. "verifier only": every question RAG first,
then the verifier; "rules+classifier+verifier": the policy's pre-route, then the verifier.
Tokens: our RAG pipeline's prompt (instructions, retrieved passages, question) and our long pipeline's
prompt (documents packed into the long window); output tokens are the recorded answers'.
Prompt caching (--prompt-cache on, or --long-cache-prices): questions are replayed in file order as one
session (--cache-window N: a document's cache goes cold N questions after its last long leg). A strategy's
long leg on a document it already sent long reads the document block from the provider's cache at the read
rate; its first one writes it (at the write rate when the provider charges one). The block is cached only when
every unit of the documents fits the window (the gateway then sends the same block for every question) and it
has at least the long model's prompt_cache_min_tokens (1,024 by default). Always-long, the baseline, is priced alike.
"""
ABSENT_NOTES = """\
Suppose the cheap route refused: would the keep-refusal option keep that refusal (evidence says the answer
is absent) or escalate to the long route? Measured on SQuAD 2.0 questions (is_impossible = truly absent),
each article's paragraphs as the documents, with the gateway's features and retrieval. No model answers.
"""


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "eval",
        parents=parents,
        help="offline routing evaluation (replay, L-Eval)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="eval_command", metavar="EVAL_COMMAND")
    sub.required = True

    prep = sub.add_parser("prepare-leval", parents=parents, help="L-Eval paired answers -> paired replay format")
    prep.add_argument("leval_dir", type=Path, help="folder with paired_rag_vs_lc.jsonl and LEval-data/")
    prep.add_argument("out_dir", type=Path, help="writes OUT/paired.jsonl and OUT/docs/<doc_id>.txt")
    prep.set_defaults(func=run_prepare_leval)

    replay = sub.add_parser(
        "replay",
        parents=parents,
        help="replay routing strategies over paired answers",
        description=REPLAY_NOTES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument(
        "--data",
        required=True,
        type=Path,
        action="append",
        help="paired answers, JSON lines; repeat with --docs for several corpora in one run (each "
        "file a corpus: its lines' `corpus`, else the file's name)",
    )
    replay.add_argument(
        "--docs",
        required=True,
        type=Path,
        action="append",
        help="folder of <doc_id>.txt documents (one per --data, in the same order)",
    )
    replay.add_argument("--policy", type=Path, default=None, help="policy (default: the shipped one)")
    replay.add_argument(
        "--prices",
        choices=["auto", "policy", "reference"],
        default="auto",
        help="auto: the policy's models' prices as the ledger prices them (the policy's, else "
        "litellm's cost map) when non-zero, else the reference pair gpt-3.5-turbo / "
        "gpt-3.5-turbo-16k from litellm's cost map",
    )
    add_cache_arguments(replay)
    replay.add_argument(
        "--window-tokens",
        type=int,
        default=None,
        action="append",
        help="long route window (default: the policy's); 16385 matches L-Eval's gpt-3.5-turbo-16k; "
        "once for every corpus or once per --data, in order (LaRA-128k: 128000)",
    )
    replay.add_argument("--threshold", type=float, default=None, help="override the policy's classifier threshold")
    replay.add_argument(
        "--estimator",
        choices=["logistic", "boosting"],
        default="boosting",
        help="boosting: gradient-boosted trees (the shipped model); logistic: a linear model",
    )
    replay.add_argument(
        "--verifier-estimator",
        choices=list(ESTIMATORS),
        default=None,
        help="the refitted verifier's estimator (default: --estimator's); --features portable was measured "
        "with logistic; monotonic: boosting with each feature's direction held (classifier.estimators)",
    )
    replay.add_argument("--folds", type=int, default=5)
    replay.add_argument(
        "--protocol",
        choices=["grouped", "loto", "corpus", "model"],
        default="grouped",
        help="out-of-fold refits: grouped = k folds by document; loto = leave one task out "
        "(lines' `task`): train on the other tasks, score this one; corpus = leave one corpus "
        "out (several --data files, or lines' `corpus`); model = leave one model family out "
        "(lines' `model`) and its documents' fold. Per held-out unit the report gives the "
        "verifier against random escalation at the same share, the strategies, tokens and cost",
    )
    replay.add_argument(
        "--max-token-share",
        type=float,
        default=None,
        help="also choose one (classifier, verifier) setting that keeps every held-out unit within "
        "this share of its always-long's tokens, best worst-unit margin over the better of "
        "always-long and always-RAG (printed, nothing written)",
    )
    replay.add_argument(
        "--features",
        choices=["card", "transfer", "transfer+support", "portable", "portable+support", "all"],
        default="card",
        help="the features a refitted verifier reads: card (default) = the policy's verifier's; "
        "transfer = classifier.verifier.TRANSFER_FEATURE_NAMES; transfer+support = with the "
        "answer's support in embedding space; portable = PORTABLE_FEATURE_NAMES (without the features "
        "whose effect reverses between corpora, with the signals that hold on every corpus and model "
        "measured; with --verifier-estimator logistic); portable+support = it with the answer's support "
        "in embedding space; all = every answer feature",
    )
    replay.add_argument(
        "--importance",
        action="store_true",
        help="permutation importance of each verifier feature under the protocol: the loss in "
        "gain-weighted AUC and in the transfer figure on the held-out units when it is shuffled",
    )
    replay.add_argument(
        "--model", type=Path, default=None, help="a trained route model (.skops) replayed as is, without refitting"
    )
    replay.add_argument(
        "--verifier",
        type=Path,
        default=None,
        help="a trained verifier (.skops) replayed as is, without refitting (default: the policy's "
        "routing.verifier refitted per fold; none: no verifier strategies)",
    )
    replay.add_argument(
        "--verifier-threshold",
        type=float,
        default=None,
        help="escalate below this P(good) (default: the policy's, else the verifier card's)",
    )
    replay.add_argument("--seed", type=int, default=0)
    replay.add_argument("--json", action="store_true", help="print the results as JSON")
    replay.add_argument("--plot", type=Path, default=None, help="write the cost-quality curve (PNG)")
    simulate.add_arguments(replay)
    replay.set_defaults(func=run_replay)

    absent = sub.add_parser(
        "absent",
        parents=parents,
        help="keep-refusal option on truly unanswerable questions (SQuAD 2.0 JSON)",
        description=ABSENT_NOTES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    absent.add_argument("--squad", required=True, type=Path, help="SQuAD 2.0 JSON file")
    absent.add_argument("--policy", type=Path, default=None, help="policy (default: the shipped one)")
    absent.add_argument("--json", action="store_true")
    absent.set_defaults(func=run_absent)
    # `eval live` calls real models through a running gateway; it lives in its own module
    eval_live.register(sub, parents)


def run_prepare_leval(args: argparse.Namespace) -> int:
    from gateway.evaluation.leval import prepare_leval

    try:
        report = prepare_leval(args.leval_dir, args.out_dir)
    except (OSError, ValueError) as exc:
        print(f"selfroute eval prepare-leval: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {report.questions} questions over {report.documents} documents to "
        f"{report.out_dir / 'paired.jsonl'} and {report.out_dir / 'docs'}/"
    )
    if report.query_mismatches:
        print(
            f"note: {report.query_mismatches} queries differ from the L-Eval instruction they index (kept as recorded)"
        )
    return 0


def load_paired(args: argparse.Namespace, command: str):
    """The --data/--docs pairs of a replay command as one list of examples, and their --window-tokens per corpus."""
    from gateway.evaluation.examples import ExampleFileError, corpus_windows, load_corpora

    if len(args.data) != len(args.docs):
        raise ExampleFileError(f"give one --docs per --data ({len(args.data)} --data, {len(args.docs)} --docs)")
    examples = load_corpora(list(zip(args.data, args.docs)))
    for e in examples:
        if "rag_score" not in e.record or "lc_score" not in e.record:
            raise ExampleFileError(f"{command}: every line needs rag_score and lc_score")
    return examples, corpus_windows(examples, args.window_tokens)


def run_replay(args: argparse.Namespace) -> int:
    from classifier.model import ModelFileError
    from classifier.training import label_from_scores
    from classifier.verifier import PROTOCOL_NAMES, protocol_splits, split_units
    from gateway.evaluation.examples import CorpusInputs, ExampleFileError
    from gateway.evaluation.prices import resolve_prices
    from gateway.evaluation.replay import (
        gap_recovery,
        run_strategies,
        sweep,
        with_threshold,
        without_rules,
        without_verifier,
    )
    from gateway.evaluation.report import (
        build_items,
        format_cache,
        format_gap,
        format_per_task,
        format_table,
        plot_curve,
    )
    from gateway.evaluation.transfer import (
        format_threshold_curves,
        format_transfer_curve,
        format_units,
        unit_reports,
    )
    from gateway.evaluation.verification import CachedEmbed, protocol_inputs, replay_scores
    from gateway.settings import resolve_data_dir
    from pipelines.unanswerable import UnanswerableDetector
    from policies.loader import PolicyError, load_policy

    try:
        policy, policy_file = load_policy(args.policy)
        if args.threshold is not None:
            policy = with_threshold(policy, args.threshold)
        examples, windows = load_paired(args, "a replay")
        prices = resolve_prices(policy, args.prices, **cache_options(args))
        labels = [label_from_scores(e.record["rag_score"], e.record["lc_score"]) for e in examples]
        groups = [e.group for e in examples]
        splits = protocol_splits(
            args.protocol, labels, groups, n_splits=args.folds, seed=args.seed, **protocol_inputs(examples)
        )
    except (PolicyError, ExampleFileError, OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"selfroute eval replay: {exc}", file=sys.stderr)
        return 2
    if args.simulate_learning:
        return simulate.run(args, policy, policy_file, examples, prices, splits)
    data_dir = resolve_data_dir(args.data_dir)
    builder = CorpusInputs(policy, data_dir / "lancedb", windows, cache_dir=data_dir / "cache")
    inputs = builder.all_inputs(examples, progress=not args.json)
    embed = CachedEmbed(builder.embedder, data_dir / "cache")
    rows: list[dict] = []
    try:
        probabilities, verifier_scores, verifier_threshold = replay_scores(
            policy,
            policy_file,
            examples,
            inputs,
            builder,
            protocol=args.protocol,
            estimator=args.estimator,
            folds=args.folds,
            seed=args.seed,
            model=args.model,
            verifier_file=args.verifier,
            verifier_threshold=args.verifier_threshold,
            progress=not args.json,
            embed=embed,
            splits=splits,
            rows_out=rows,
            feature_names=refit_features(args.features),
            verifier_estimator=args.verifier_estimator,
        )
    except (ValueError, ModelFileError, OSError) as exc:
        print(f"selfroute eval replay: {exc}", file=sys.stderr)
        return 2
    detector = UnanswerableDetector(policy.rag.unanswerable_patterns)
    items = build_items(examples, inputs, probabilities, detector, verifier_scores)
    results = run_strategies(items, policy, prices, verifier_threshold)
    held_out = args.protocol in ("corpus", "model", "loto")
    units = split_units(splits, len(items)) if held_out else [e.corpus or "all" for e in examples]
    reports = unit_reports(items, units, policy, prices, verifier_threshold)
    unit_label = {"corpus": "held-out corpus", "model": "held-out model", "loto": "held-out task"}.get(
        args.protocol, "corpus"
    )
    choice = None
    if args.max_token_share is not None and verifier_scores is not None:
        from gateway.evaluation.tradeoff import choose_across_units

        choice = choose_across_units(items, units, policy, prices, max_share=args.max_token_share)
    importance = None
    if args.importance and verifier_scores is not None and args.verifier is None:
        importance = _importance(
            rows, examples, splits, units, args, refit_features(args.features) or builder_features(policy, policy_file)
        )
    policy = without_verifier(policy)  # the threshold curves below are the pre-route's
    curves = {
        "classifier alone (thresholds)": sweep(items, without_rules(policy), prices, fallback=False),
        "rules+classifier (thresholds)": sweep(items, policy, prices, fallback=False),
        "rules+classifier+fallback (thresholds)": sweep(items, policy, prices, fallback=True),
    }
    gap = gap_recovery(items)
    threshold = policy.routing.classifier.threshold if policy.routing.classifier else None
    names = ", ".join(str(d) for d in args.data)
    if args.plot:
        try:
            plot_curve(
                args.plot,
                curves,
                results,
                f"Replay: {len(items)} questions, {len(set(groups))} documents ({', '.join(d.name for d in args.data)})",
            )
        except RuntimeError as exc:
            print(f"selfroute eval replay: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(
            json.dumps(
                {
                    "questions": len(items),
                    "documents": len(set(groups)),
                    "prices": asdict(prices),
                    "corpora": sorted({e.corpus for e in examples}),
                    "data": [str(d) for d in args.data],
                    "window_tokens": builder.window,
                    "threshold": threshold,
                    "verifier_threshold": verifier_threshold,
                    "protocol": args.protocol,
                    "model": str(args.model) if args.model else None,
                    "verifier": str(args.verifier) if args.verifier else None,
                    "strategies": [r.to_dict() for r in results],
                    "units": [r.to_dict() for r in reports],
                    "chosen_across_units": asdict(choice) if choice else None,
                    "importance": importance,
                    "gap_recovery": {k: v for k, v in gap.__dict__.items() if k != "curve"},
                    "curves": curves,
                    "plot": str(args.plot) if args.plot else None,
                },
                indent=2,
                default=float,
            )
        )
        return 0
    source = (
        f"from {args.model}"
        if args.model
        else f"out-of-fold ({PROTOCOL_NAMES[args.protocol]}"
        + (f", {args.folds} folds, seed {args.seed})" if args.protocol in ("grouped", "model") else ")")
    )
    verifier_source = (
        f"{args.verifier}"
        if args.verifier
        else "the policy's, refitted out of fold like P(cheap)"
        if verifier_threshold is not None
        else "none"
    )
    print(
        f"{len(items)} questions over {len(set(groups))} documents ({names}); long window {builder.window} tokens; "
        f"classifier threshold {threshold}; P(cheap) {source}; verifier {verifier_source}"
        + (f", threshold {verifier_threshold:.4f}" if verifier_threshold is not None else "")
    )
    print(
        f"prices (USD per million tokens): cheap {prices.cheap_input:g} in / {prices.cheap_output:g} out, "
        f"long {prices.long_input:g} in / {prices.long_output:g} out ({prices.source})"
    )
    print(format_cache(prices.long_cache, items))
    print(format_table(results))
    print(format_gap(gap))
    if held_out or len(set(units)) > 1:
        print(
            f"\nPer {unit_label} (quality; each scored by models that never saw it; router = the policy's "
            "pre-route + verifier at its thresholds):"
        )
        print(format_units(reports, unit_label))
        curve = format_transfer_curve(reports)
        if curve:
            print("\nVerifier minus random escalation at the same share (points), per unit:")
            print(curve)
            print(
                "\nVerifier's threshold curve (every question RAG first): best quality vs always-long (points; "
                "share escalated) within each share of always-long's cost:"
            )
            print(format_threshold_curves(reports))
            print("... and within each share of always-long's tokens:")
            print(format_threshold_curves(reports, key="tokens_vs_long"))
    if choice is not None:
        print(
            f"\nOne setting for every unit, tokens <= {choice.cap:g} of always-long on each"
            + ("" if choice.met else " (NOT MET: the closest setting)")
            + f": classifier threshold "
            f"{choice.pre_threshold}, verifier threshold {choice.verifier_threshold:.4f}, refusal threshold "
            + ("none" if choice.refusal_threshold is None else f"{choice.refusal_threshold:.4f}")
            + f"; worst unit {choice.worst_margin_points:+.2f} points vs the better of always-long and always-RAG"
        )
        for unit, o in sorted(choice.per_unit.items()):
            print(
                f"  {unit}: quality {o['quality']:.4f} ({o['vs_better_baseline_points']:+.2f} vs the better "
                f"baseline), tokens {o['tokens_vs_long']:.3f}, cost {o['cost_vs_long']:.3f}, long or escalated "
                f"{100 * o['long_share']:.1f}%; Self-Route {o['self_route_quality']:.4f} at "
                f"{o['self_route_tokens_vs_long']:.3f} tokens: "
                + ("beaten" if o["beats_self_route"] else "not beaten at no more tokens")
            )
    if importance:
        print(
            "\nPermutation importance under the protocol (loss when the feature is shuffled within each held-out "
            "unit; mean over units):"
        )
        for name, v in importance:
            print(f"  {name:32s} gain AUC {v['auc']:+.4f}   transfer @25% {v['transfer']:+.2f} pts")
    if any(i.task for i in items):
        print("\nPer task (quality; share answered or escalated long):")
        print(format_per_task(results, items))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def refit_features(choice: str) -> list[str] | None:
    """--features: the refitted verifier's feature names (None: the policy's verifier's)."""
    from classifier.verifier import FEATURE_SETS

    return None if choice == "card" else list(FEATURE_SETS[choice])


def builder_features(policy, policy_file) -> list[str]:
    """The verifier features a refit reads (gateway.evaluation.verification.verifier_features)."""
    from gateway.evaluation.verification import verifier_features
    from gateway.routing.model_files import load_verifier_model

    return verifier_features(load_verifier_model(policy, policy_file))


def _importance(rows, examples, splits, units, args, names):
    from classifier.verifier import choice_weights, label_good, permutation_importance

    rag = [float(e.record["rag_score"]) for e in examples]
    lc = [float(e.record["lc_score"]) for e in examples]
    labels = [label_good(r, c) for r, c in zip(rag, lc)]
    return permutation_importance(
        rows,
        labels,
        rag,
        lc,
        splits,
        units,
        feature_names=names,
        estimator=args.verifier_estimator or args.estimator,
        seed=args.seed,
        sample_weight=choice_weights(rag, lc),
    )


def run_absent(args: argparse.Namespace) -> int:
    from gateway.evaluation.absent import AbsentQuestion, absent_report, load_squad
    from gateway.evaluation.examples import RouteInputBuilder
    from gateway.routing.model_files import load_route_model
    from gateway.settings import resolve_data_dir
    from policies.loader import PolicyError, load_policy

    try:
        policy, policy_file = load_policy(args.policy)
        model = load_route_model(policy, policy_file)
        pairs = load_squad(args.squad)
    except (PolicyError, OSError, ValueError, KeyError) as exc:
        print(f"selfroute eval absent: {exc}", file=sys.stderr)
        return 2
    data_dir = resolve_data_dir(args.data_dir)
    builder = RouteInputBuilder(policy, data_dir / "lancedb", cache_dir=data_dir / "cache")
    inputs = builder.all_inputs([e for e, _ in pairs], progress=not args.json, with_long=False)
    probabilities = model.cheap_probabilities([i.features for i in inputs]) if model else [None] * len(inputs)
    questions = [
        AbsentQuestion(e.group, e.query, impossible, i.features, p)
        for (e, impossible), i, p in zip(pairs, inputs, probabilities)
    ]
    report = absent_report(questions, policy.routing.fallback)
    if args.json:
        print(json.dumps(report.__dict__, indent=2, default=float))
    else:
        print("\n".join(report.lines()))
    return 0
