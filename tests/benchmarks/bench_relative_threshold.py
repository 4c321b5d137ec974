"""A verifier threshold relative to the deployment's own traffic (routing.verifier.relative) against the fixed one,
on out-of-fold scores under leave one corpus out and leave one model family out, causally: each held-out unit is one
deployment (one key) whose questions arrive in `stream_order` (documents shuffled, a document's questions together),
each decided by the live check (gateway.evaluation.replay.router_strategy -> CheapAnswerCheck.verdict) from the
answers before it.

    .venv/bin/python tests/benchmarks/bench_relative_threshold.py --items corpus=F1 --items model=F2 \\
        [--policy policies/default.yaml] [--seeds 0 1 2 3 4] [--grid] [--unshipped]

F1, F2: the scored items `tests/benchmarks/bench_threshold_frontier.py --items-cache F --protocol corpus|model
--features portable --verifier-estimator logistic --no-sweep` writes. Printed per rule and unit: quality against the
better of always-long and always-RAG (points), tokens against always-long, quality and tokens against Self-Route,
over the seeds (min..max), and the issue's two targets (met in every seed): >= better baseline - 1 point at <= 30%
of always-long's tokens; more quality than Self-Route at no more tokens. --grid: the rules tried to choose the
shipped parameters (fixed thresholds; running quantile; share of refusals without and with the token budget).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    from policies.loader import load_policy
    from tests.benchmarks.bench_threshold_frontier import cached_units

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", action="append", required=True, help="PROTOCOL=PICKLE (bench_threshold_frontier)")
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--grid", action="store_true", help="also every relative setting of the exploration")
    parser.add_argument(
        "--unshipped",
        action="store_true",
        help="also the rules explored but not built: a running P(good) quantile, and a share of refusals without "
        "the token budget (simulated here, not the live check)",
    )
    args = parser.parse_args()
    policy, _ = load_policy(args.policy)
    units = {u: items for found in cached_units(args.items).values() for u, (items, _) in found.items()}
    rules = [("as in the policy", policy), ("fixed thresholds", _with_relative(policy, None))]
    if args.grid:
        for window in (200, 500, 1000):
            for spend in (0.8, 0.9, 1.0):
                for pool in (1.0, 1.5, 2.0, 3.0):
                    rules.append(
                        (
                            f"window {window}, spend {spend}, pool {pool}",
                            _with_relative(policy, dict(window=window, warm_up=50, refusal_spend=spend, pool=pool)),
                        )
                    )
    for name, candidate in rules:
        _report(name, candidate, units, args.seeds)
    if args.unshipped:
        verifier = policy.routing.verifier
        for window in (200, 500, 1000):
            for q in (0.02, 0.05, 0.1, 0.15):
                _report_unshipped(f"quantile {q}, window {window}", units, args.seeds, verifier, window, quantile=q)
            for k in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
                _report_unshipped(f"refusal share x {k}, window {window}", units, args.seeds, verifier, window, k=k)
    return 0


def _unshipped(items, order, verifier, window, quantile=None, k=None, warm_up=50):
    """Escalations of a rule not built into the gateway, in stream order: below the running `quantile` of the last
    `window` P(good), or below the running (k x refusal share) quantile, no token budget; the fixed thresholds
    (the policy's) until warm."""
    import bisect
    from collections import deque

    seen, ranked, refused, escalate = deque(), [], 0, [False] * len(items)
    for index in order:
        item = items[index]
        s, r = item.verifier_score, item.rag_refused
        n = len(ranked)
        if n >= warm_up:
            share = quantile if quantile is not None else min(1.0, k * refused / n)
            rank = int(share * n)
            threshold = (ranked[rank] if rank < n else 2.0) if rank > 0 else 0.0
            escalate[index] = s < threshold
        else:
            escalate[index] = s < verifier.threshold or (
                r and verifier.refusal_threshold is not None and s < verifier.refusal_threshold
            )
        seen.append((s, r))
        bisect.insort(ranked, s)
        refused += r
        if len(seen) > window:
            old_s, old_r = seen.popleft()
            del ranked[bisect.bisect_left(ranked, old_s)]
            refused -= old_r
    return escalate


def _baselines(items):
    """(always-long's tokens, the better of always-long and always-RAG, Self-Route's quality and token share)."""
    from gateway.evaluation.replay import self_route

    long_tokens = sum(i.long_prompt_tokens for i in items)
    best = max(sum(i.lc_score for i in items), sum(i.rag_score for i in items)) / len(items)
    sr = [self_route(i) for i in items]
    sr_q = sum(o.score for o in sr) / len(items)
    sr_t = sum(leg.prompt_tokens for o in sr for leg in o.legs) / long_tokens
    return long_tokens, best, sr_q, sr_t


def _report_unshipped(name, units, seeds, verifier, window, **rule) -> None:
    from gateway.evaluation.replay import stream_order

    print(f"== unshipped: {name}")
    met = [0, 0]
    for unit, items in units.items():
        long_tokens, best, sr_q, sr_t = _baselines(items)
        runs = []
        for seed in seeds:
            esc = _unshipped(items, stream_order(items, seed), verifier, window, **rule)
            q = sum(i.lc_score if e else i.rag_score for i, e in zip(items, esc)) / len(items)
            t = sum(i.rag_prompt_tokens + e * i.long_prompt_tokens for i, e in zip(items, esc)) / long_tokens
            runs.append((q, t))
        t1 = all(100 * (q - best) >= -1.0 and t <= 0.3 for q, t in runs)
        t2 = all(q > sr_q and t <= sr_t for q, t in runs)
        met[0] += t1
        met[1] += t2
        print(
            f"  {unit}: vs better baseline {min(100 * (q - best) for q, _ in runs):+.2f}..{max(100 * (q - best) for q, _ in runs):+.2f}"
            f" at tokens {min(t for _, t in runs):.3f}..{max(t for _, t in runs):.3f}; vs Self-Route "
            f"{min(100 * (q - sr_q) for q, _ in runs):+.2f}..{max(100 * (q - sr_q) for q, _ in runs):+.2f} points, tokens "
            f"{min(t - sr_t for _, t in runs):+.3f}..{max(t - sr_t for _, t in runs):+.3f}: {int(t1)}{int(t2)}"
        )
    print(f"  targets met in every seed: {met[0]} + {met[1]} = {sum(met)} of {2 * len(units)}", flush=True)


def _with_relative(policy, settings):
    from policies.schema import RelativeThreshold

    copy = policy.model_copy(deep=True)
    assert copy.routing.verifier is not None, "the policy has no verifier"
    copy.routing.verifier.relative = RelativeThreshold(**settings) if settings is not None else None
    return copy


def _report(name, policy, units, seeds) -> None:
    from gateway.evaluation.replay import router_strategy, stream_order
    from gateway.routing.decision import Router
    from policies.routes import FALLBACK

    relative = policy.routing.verifier.relative
    print(
        f"== {name}: {relative.model_dump() if relative else 'none'}, "
        f"threshold {policy.routing.verifier.threshold:.4f}, refusal {policy.routing.verifier.refusal_threshold}"
    )
    met = [0, 0]
    for unit, items in units.items():
        long_tokens, best, sr_q, sr_t = _baselines(items)
        runs = []
        for seed in seeds:
            strategy = router_strategy(Router(policy), True)  # a fresh check: one deployment, one key
            outcomes = [strategy(items[k]) for k in stream_order(items, seed)]
            q = sum(o.score for o in outcomes) / len(items)
            t = sum(leg.prompt_tokens for o in outcomes for leg in o.legs) / long_tokens
            esc = sum(o.route == FALLBACK for o in outcomes) / len(items)
            runs.append((q, t, esc))
        t1 = all(100 * (q - best) >= -1.0 and t <= 0.3 for q, t, _ in runs)
        t2 = all(q > sr_q and t <= sr_t for q, t, _ in runs)
        met[0] += t1
        met[1] += t2
        vs = [100 * (q - best) for q, _, _ in runs]
        dq = [100 * (q - sr_q) for q, _, _ in runs]
        dt = [t - sr_t for _, t, _ in runs]
        print(
            f"  {unit}: n {len(items)}, vs better baseline {min(vs):+.2f}..{max(vs):+.2f} at tokens "
            f"{min(r[1] for r in runs):.3f}..{max(r[1] for r in runs):.3f} (escalated "
            f"{100 * min(r[2] for r in runs):.1f}..{100 * max(r[2] for r in runs):.1f}%): "
            f"{'met' if t1 else 'missed'}; vs Self-Route ({sr_q:.4f} at {sr_t:.3f}) {min(dq):+.2f}..{max(dq):+.2f} "
            f"points, tokens {min(dt):+.3f}..{max(dt):+.3f}: {'met' if t2 else 'missed'}"
        )
    print(
        f"  targets met in every seed: {met[0]} (within 1 point at <= 0.3) + {met[1]} (beats Self-Route) "
        f"= {sum(met)} of {2 * len(units)}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
