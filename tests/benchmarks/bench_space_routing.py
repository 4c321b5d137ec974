"""The shipped router's decisions under two embedding backends (issue 23 item 2: may `onnx-int8` be the default?).

    PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/bench_space_routing.py \\
        --data L1.jsonl --docs DOCS1 [--data L2.jsonl --docs DOCS2] [--window-tokens N ...] \\
        --data-dir-a DIR_A [--backend-a onnx] --data-dir-b DIR_B [--backend-b onnx-int8] \\
        [--policy FILE] [--model classifier/models/default.skops] [--verifier classifier/models/verifier.skops]

Each side builds the replay's routing inputs (gateway.evaluation.examples.CorpusInputs: the documents embedded into
that side's store, one retrieval per question, cached in DIR/cache as `selfroute eval replay --data-dir DIR` caches
them) with the policy's rag.embedding_backend replaced by that side's backend, then scores them with the shipped
classifier (P(cheap)) and verifier (P(good)) as the replay does with --model/--verifier. Printed: how far each
retrieval feature of the pre-route and each verifier feature moves between the two sides (mean and largest |change|,
share of questions where it changed), how many pre-route routes and fixed-threshold verifier verdicts flip under the
policy's thresholds, and the replay's strategies (quality, tokens) on each side through the live decision and check
(gateway.evaluation.replay.run_strategies, the relative threshold included), per corpus.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REPO = Path(__file__).resolve().parents[2]


def load_side(policy, policy_file, examples, windows, data_dir: Path, model, verifier):
    from gateway.evaluation.examples import CorpusInputs
    from gateway.evaluation.verification import CachedEmbed, replay_scores

    builder = CorpusInputs(policy, data_dir / "lancedb", windows, cache_dir=data_dir / "cache")
    inputs = builder.all_inputs(examples, progress=True)
    rows: list[dict] = []
    probabilities, scores, threshold = replay_scores(
        policy,
        policy_file,
        examples,
        inputs,
        builder,
        model=model,
        verifier_file=verifier,
        progress=True,
        embed=CachedEmbed(builder.embedder, data_dir / "cache"),
        rows_out=rows,
    )
    return builder, inputs, [float(p) for p in probabilities], [float(s) for s in scores], threshold, rows


def moves(name: str, a: list[float], b: list[float]) -> str:
    import math

    pairs = [(x, y) for x, y in zip(a, b) if not (math.isnan(x) and math.isnan(y))]
    diffs = [abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf for x, y in pairs]
    changed = sum(d > 1e-9 for d in diffs)
    finite = [d for d in diffs if math.isfinite(d)]
    spread = statistics.pstdev([x for x, _ in pairs if math.isfinite(x)]) if len(pairs) > 1 else 0.0
    return (
        f"  {name:32s} mean |d| {statistics.fmean(finite) if finite else 0:.4f}  max {max(finite, default=0):.4f}  "
        f"changed {changed / max(len(pairs), 1):6.1%}  (its sd on side a {spread:.4f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", action="append", required=True, type=Path)
    parser.add_argument("--docs", action="append", required=True, type=Path)
    parser.add_argument("--window-tokens", action="append", type=int)
    parser.add_argument("--policy", type=Path, help="default: the shipped one")
    parser.add_argument("--data-dir-a", required=True, type=Path)
    parser.add_argument("--data-dir-b", required=True, type=Path)
    parser.add_argument("--backend-a", default="onnx")
    parser.add_argument("--backend-b", default="onnx-int8")
    parser.add_argument("--model", type=Path, default=REPO / "classifier/models/default.skops")
    parser.add_argument("--verifier", type=Path, default=REPO / "classifier/models/verifier.skops")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from classifier.features import RETRIEVAL_FEATURES
    from gateway.evaluation.examples import corpus_windows, load_corpora
    from gateway.evaluation.prices import resolve_prices
    from gateway.evaluation.replay import run_strategies, with_verifier
    from gateway.routing.decision import Router
    from gateway.routing.escalation import CheapAnswerCheck
    from pipelines.unanswerable import UnanswerableDetector
    from policies.loader import load_policy

    policy, policy_file = load_policy(args.policy)
    examples = load_corpora(list(zip(args.data, args.docs, strict=True)))
    windows = corpus_windows(examples, args.window_tokens)
    print(
        f"{len(examples)} answers, {len({e.group for e in examples})} documents; load average "
        f"{Path('/proc/loadavg').read_text().split()[:3]}",
        flush=True,
    )
    sides = {}
    for label, backend, data_dir in (("a", args.backend_a, args.data_dir_a), ("b", args.backend_b, args.data_dir_b)):
        side_policy = policy.model_copy(
            update={"rag": policy.rag.model_copy(update={"embedding_backend": backend})}, deep=True
        )
        sides[label] = (
            side_policy,
            *load_side(side_policy, policy_file, examples, windows, data_dir, args.model, args.verifier),
        )
        print(
            f"side {label}: {backend}, space {sides[label][1].embedder.space}; load {Path('/proc/loadavg').read_text().split()[0]}",
            flush=True,
        )
    (pol_a, _, in_a, p_a, s_a, thr, rows_a), (pol_b, _, in_b, p_b, s_b, _, rows_b) = sides["a"], sides["b"]

    print(f"\nretrieval features of the pre-route ({args.backend_a} -> {args.backend_b}):")
    for name in RETRIEVAL_FEATURES:
        print(
            moves(
                name,
                [i.features.get(name, float("nan")) for i in in_a],
                [i.features.get(name, float("nan")) for i in in_b],
            )
        )
    print(moves("P(cheap)", p_a, p_b))
    print("\nverifier features that changed anywhere:")
    for name in sorted(rows_a[0]):
        a_values = [float(r.get(name, float("nan"))) for r in rows_a]
        b_values = [float(r.get(name, float("nan"))) for r in rows_b]
        if a_values != b_values and not all(x == y or (x != x and y != y) for x, y in zip(a_values, b_values)):
            print(moves(name, a_values, b_values))
    print(moves("P(good)", s_a, s_b))
    print(moves("rag prompt tokens", [i.rag_prompt_tokens for i in in_a], [i.rag_prompt_tokens for i in in_b]))

    detector = UnanswerableDetector(policy.rag.unanswerable_patterns)
    refused = [detector.is_unanswerable(e.record.get("rag_pred") or "") for e in examples]
    # the pre-route through the live Router at the policy's classifier threshold
    route_a = [Router(pol_a).decide(i.features, probability=p).route for i, p in zip(in_a, p_a)]
    route_b = [Router(pol_b).decide(i.features, probability=p).route for i, p in zip(in_b, p_b)]
    flips = sum(x != y for x, y in zip(route_a, route_b))
    print(
        f"\npre-route (rules + classifier at {policy.routing.classifier.threshold if policy.routing.classifier else None}):"
        f" {flips} of {len(examples)} routes differ"
    )
    verifier = policy.routing.verifier
    if verifier is not None:
        # the fixed thresholds (a key's first answers, and every answer under relative: null) through the live check
        fixed = with_verifier(policy, thr).model_copy(deep=True)
        fixed.routing.verifier.relative = None
        verdicts = {}
        for label, scores, routes in (("a", s_a, route_a), ("b", s_b, route_b)):
            check = CheapAnswerCheck(fixed)
            verdicts[label] = [
                check.verdict(
                    Router(fixed).decide(i.features, probability=p), r, s, None, i.long_prompt_tokens
                ).escalate
                for i, p, r, s in zip(in_a if label == "a" else in_b, p_a if label == "a" else p_b, refused, scores)
            ]
        a_esc, b_esc = verdicts["a"], verdicts["b"]
        both = sum(x and y for x, y in zip(a_esc, b_esc))
        print(
            f"verifier at its fixed thresholds ({thr:.4f}, refusals {verifier.refusal_threshold}): escalated "
            f"{sum(a_esc)} ({args.backend_a}) / {sum(b_esc)} ({args.backend_b}) of {len(examples)}; "
            f"flipped {sum(x != y for x, y in zip(a_esc, b_esc))} (escalated by both {both}, only a "
            f"{sum(x and not y for x, y in zip(a_esc, b_esc))}, only b {sum(y and not x for x, y in zip(a_esc, b_esc))})"
        )

    from gateway.evaluation.report import build_items

    prices = resolve_prices(policy, "auto")
    corpora = sorted({e.corpus for e in examples})
    for corpus in [None, *corpora] if len(corpora) > 1 else [None]:
        chosen = [k for k, e in enumerate(examples) if corpus is None or e.corpus == corpus]
        print(
            f"\nreplay, {'all corpora' if corpus is None else corpus} ({len(chosen)} answers): strategy, quality, tokens vs always-long"
        )
        results = {}
        for label, pol, inp, p, s in (("a", pol_a, in_a, p_a, s_a), ("b", pol_b, in_b, p_b, s_b)):
            items = build_items(
                [examples[k] for k in chosen],
                [inp[k] for k in chosen],
                [p[k] for k in chosen],
                detector,
                [s[k] for k in chosen],
            )
            results[label] = {r.name: r for r in run_strategies(items, pol, prices, thr)}
        for name, ra in results["a"].items():
            rb = results["b"][name]
            print(
                f"  {name:38s} {args.backend_a} {ra.quality:.4f} @ {ra.tokens_vs_long:.4f}   {args.backend_b} "
                f"{rb.quality:.4f} @ {rb.tokens_vs_long:.4f}   d {100 * (rb.quality - ra.quality):+.2f} pts, "
                f"{rb.tokens_vs_long - ra.tokens_vs_long:+.4f} tokens"
            )
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
