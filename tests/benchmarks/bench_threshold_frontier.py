"""What the cross-corpus threshold sweep can reach: every (classifier, verifier, refusal) setting that
`choose_across_units` tries under a protocol, and the setting other selection rules among them would pick.

    .venv/bin/python tests/benchmarks/bench_threshold_frontier.py \\
        --data LEVAL/paired.jsonl --docs LEVAL/docs --data ../shared/data/lara128k/paired.jsonl \\
        --docs ../shared/data/lara128k/docs --window-tokens 16385 --window-tokens 128000 --data-dir DATA \\
        [--protocol corpus] [--cap 0.3] [--policy F]

Scores are out of fold under the protocol, as `selfroute eval replay` computes them (P(cheap) and the verifier's
P(good), features `transfer`), so each unit is scored by models that never saw it. Printed per rule: the
thresholds and each unit's margin over the better of always-long and always-RAG, its tokens against always-long
and whether it beats Self-Route at no more tokens. "ceiling for U" is U's best margin within the cap, whatever it
costs the other units: when even that misses a target, no selection rule among these settings can meet it.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    from classifier.estimators import ESTIMATORS
    from gateway.evaluation.prices import resolve_prices
    from policies.loader import load_policy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, action="append", required=True)
    parser.add_argument("--docs", type=Path, action="append", required=True)
    parser.add_argument("--window-tokens", type=int, action="append")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--protocol", choices=["corpus", "model"], default="corpus")
    parser.add_argument("--cap", type=float, default=0.3, help="every unit's tokens within this share of always-long")
    parser.add_argument("--features", default="transfer", help="the refitted verifier's feature set (as eval replay)")
    parser.add_argument("--verifier-estimator", choices=list(ESTIMATORS), default=None)
    parser.add_argument("--no-sweep", action="store_true", help="score (and cache) the items, print --at, stop")
    parser.add_argument(
        "--at",
        type=float,
        nargs=3,
        default=None,
        metavar=("CLASSIFIER", "VERIFIER", "REFUSAL"),
        help="also print every unit's figures at these thresholds",
    )
    parser.add_argument(
        "--items-cache", type=Path, default=None, help="pickle of the scored items: read when present, else written"
    )
    args = parser.parse_args()

    policy, policy_file = load_policy(args.policy)
    prices = resolve_prices(policy, "reference")
    if args.items_cache is not None and args.items_cache.exists():
        items, units = read_items_cache(args.items_cache)
    else:
        items, units = _scored(args, policy, policy_file)
        if args.items_cache is not None:
            args.items_cache.write_bytes(pickle.dumps((items, units)))
    _report(args, policy, prices, items, units)
    return 0


def read_items_cache(path: Path) -> tuple[list, list]:
    """The scored items an --items-cache holds and each one's held-out unit (this benchmark's own file, not input)."""
    items, units = pickle.loads(Path(path).read_bytes())[:2]
    return items, units


def cached_units(specs: list[str]) -> dict[str, dict[str, tuple[list, set[int]]]]:
    """PROTOCOL=PICKLE specs (the --items of bench_relative_choice and bench_relative_threshold), each an
    --items-cache of this benchmark: {protocol: {"protocol:unit": (the unit's items, their positions in the file)}}.
    The files of both protocols list the same answers in the same order, so positions tell shared answers apart."""
    found: dict[str, dict[str, tuple[list, set[int]]]] = {}
    for spec in specs:
        protocol, path = spec.split("=", 1)
        items, labels = read_items_cache(Path(path))
        found[protocol] = {
            f"{protocol}:{unit}": (
                [item for item, label in zip(items, labels) if label == unit],
                {k for k, label in enumerate(labels) if label == unit},
            )
            for unit in sorted(set(labels))
        }
    return found


def _scored(args, policy, policy_file):
    """The replay's items scored out of fold under the protocol (as `selfroute eval replay`), and their units."""
    from classifier.training import label_from_scores
    from classifier.verifier import protocol_splits, split_units
    from gateway.commands.eval import refit_features
    from gateway.evaluation.examples import CorpusInputs, corpus_windows, load_corpora
    from gateway.evaluation.report import build_items
    from gateway.evaluation.verification import CachedEmbed, protocol_inputs, replay_scores
    from pipelines.unanswerable import UnanswerableDetector

    examples = load_corpora(list(zip(args.data, args.docs)))
    labels = [label_from_scores(e.record["rag_score"], e.record["lc_score"]) for e in examples]
    groups = [e.group for e in examples]
    splits = protocol_splits(args.protocol, labels, groups, n_splits=5, seed=0, **protocol_inputs(examples))
    builder = CorpusInputs(
        policy,
        args.data_dir / "lancedb",
        corpus_windows(examples, args.window_tokens),
        cache_dir=args.data_dir / "cache",
    )
    inputs = builder.all_inputs(examples)
    p_cheap, p_good, _ = replay_scores(
        policy,
        policy_file,
        examples,
        inputs,
        builder,
        protocol=args.protocol,
        splits=splits,
        embed=CachedEmbed(builder.embedder, args.data_dir / "cache"),
        feature_names=refit_features(args.features),
        verifier_estimator=args.verifier_estimator,
    )
    items = build_items(examples, inputs, p_cheap, UnanswerableDetector(policy.rag.unanswerable_patterns), p_good)
    return items, split_units(splits, len(items))


def _report(args, policy, prices, items, units) -> None:
    import numpy as np

    from gateway.evaluation.replay import with_threshold
    from gateway.evaluation.tradeoff import Table, quantile_grid, refusal_grid, self_route_outcome

    # the same grid and per-unit outcomes as gateway.evaluation.tradeoff.choose_across_units
    table = Table(items, prices)
    names = sorted(set(units))
    index = {u: np.flatnonzero(np.asarray(units) == u) for u in names}
    best = {u: 100 * max(float(table.lc[i].mean()), float(table.rag[i].mean())) for u, i in index.items()}
    self_route = {u: self_route_outcome(table, i) for u, i in index.items()}
    if args.at is not None:
        t1, t2, t3 = args.at
        routes = table.routes(with_threshold(policy, t1))
        print(f"at classifier {t1:g}, verifier {t2:g}, refusal {t3:g}:")
        for u in names:
            o = table.outcome(routes, t2, index[u], t3)
            i = index[u]
            print(
                f"  {u}: n {len(i)}, always-long {table.lc[i].mean():.4f}, always-RAG {table.rag[i].mean():.4f}, "
                f"Self-Route {self_route[u]['quality']:.4f} ({self_route[u]['tokens_vs_long']:.3f}), router "
                f"{o['quality']:.4f} ({o['tokens_vs_long']:.3f} / {o['cost_vs_long']:.3f}), long or escalated "
                f"{100 * o['long_share']:.1f}%, vs better baseline {100 * o['quality'] - best[u]:+.2f}"
            )
    if args.no_sweep:
        return
    settings = []
    for t1 in quantile_grid([i.probability for i in table.items], 30):
        routes = table.routes(with_threshold(policy, t1))
        for t2 in quantile_grid([i.verifier_score for i in table.items], 40):
            for t3 in refusal_grid(table, policy):
                per = {u: table.outcome(routes, t2, i, t3) for u, i in index.items()}
                settings.append(
                    {
                        "t": (t1, t2, t3),
                        "per": per,
                        "margin": {u: 100 * per[u]["quality"] - best[u] for u in names},
                        "beats": {
                            u: int(
                                per[u]["quality"] > self_route[u]["quality"]
                                and per[u]["tokens_vs_long"] <= self_route[u]["tokens_vs_long"] + 1e-12
                            )
                            for u in names
                        },
                        "share": max(per[u]["tokens_vs_long"] for u in names),
                    }
                )

    def within(cap):
        return [s for s in settings if s["share"] <= cap + 1e-12]

    def targets(s):
        return sum(int(s["margin"][u] >= -1.0) + s["beats"][u] for u in names)

    def worst(s):
        return min(s["margin"].values())

    def mean(s):
        return float(np.mean(list(s["margin"].values())))

    def show(label, s):
        t1, t2, t3 = s["t"]
        print(
            f"{label}: classifier {t1:.4f}, verifier {t2:.4f}, refusal {'none' if t3 is None else f'{t3:.4f}'}; "
            + "; ".join(
                f"{u} {s['margin'][u]:+.2f} pts at {s['per'][u]['tokens_vs_long']:.3f} tokens"
                + (", beats Self-Route" if s["beats"][u] else "")
                for u in names
            )
        )

    feasible = within(args.cap)
    print(
        f"{len(settings)} settings under leave one {args.protocol} out, {len(feasible)} within {args.cap:g} of "
        "always-long's tokens on every unit; better baseline per unit: "
        + ", ".join(f"{u} {best[u] / 100:.4f}" for u in names)
    )
    if not feasible:
        return
    show(
        "shipped rule (most targets, then worst margin, mean)",
        max(feasible, key=lambda s: (targets(s), worst(s), mean(s))),
    )
    show("worst margin only", max(feasible, key=lambda s: (worst(s), mean(s))))
    show("mean margin", max(feasible, key=mean))
    lo = {u: min(s["margin"][u] for s in feasible) for u in names}
    hi = {u: max(s["margin"][u] for s in feasible) for u in names}
    show(
        "worst share of each unit's reachable range",
        max(feasible, key=lambda s: min((s["margin"][u] - lo[u]) / max(hi[u] - lo[u], 1e-9) for u in names)),
    )
    for u in names:
        show(f"ceiling for {u}", max(feasible, key=lambda s: (s["margin"][u], -s["share"])))
        for floor in (-1.0, -2.0):
            ok = [s for s in feasible if all(s["margin"][v] >= floor for v in names if v != u)]
            if ok:
                show(f"best {u} with every other unit >= {floor:+g}", max(ok, key=lambda s: s["margin"][u]))
    for cap in (0.2, 0.4, 0.5):
        if within(cap):
            show(f"shipped rule at a {cap:g} cap", max(within(cap), key=lambda s: (targets(s), worst(s), mean(s))))


if __name__ == "__main__":
    raise SystemExit(main())
