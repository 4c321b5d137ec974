"""The relative rule's parameters chosen under the held-out protocol (gateway.evaluation.relative_choice), on the
cached out-of-fold scores: every candidate of `candidate_grid` (round six's refusal-spend grid and the round-seven
variants) replayed through the live CheapAnswerCheck.verdict on every held-out unit (one key per unit, questions in
stream_order), then the nested choice: for each unit, the candidate the criterion picks on the other units of its
protocol only, scored on that unit.

    .venv/bin/python tests/benchmarks/bench_relative_choice.py --items corpus=F1 --items model=F2 \\
        [--policy policies/default.yaml] [--seeds 0 1 2 3 4] [--all]

F1, F2: the scored items `tests/benchmarks/bench_threshold_frontier.py --items-cache F --protocol corpus|model
--features portable --verifier-estimator logistic --no-sweep` writes. Printed: each candidate's figures on every
unit (--all; else only the policy's own, the fixed thresholds and the chosen ones), the candidate chosen on all
units of each protocol and on both together, and the nested (held-out) figures per unit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _line(unit, f):
    return (
        f"  {unit}: n {f.n}, vs better {f.gap_points[0]:+.2f}..{f.gap_points[1]:+.2f} at tokens "
        f"{f.tokens[0]:.3f}..{f.tokens[1]:.3f} (escalated {100 * f.escalated[0]:.1f}..{100 * f.escalated[1]:.1f}%) "
        f"{'met' if f.within else 'missed'}; vs Self-Route {f.self_route_points[0]:+.2f}..{f.self_route_points[1]:+.2f}"
        f" (SR tokens {f.self_route_tokens:.3f}) {'met' if f.beats_self_route else 'missed'}"
    )


def main() -> int:
    from gateway.evaluation.relative_choice import (
        candidate_grid,
        choose_relative,
        criterion,
        describe,
        evaluate_candidates,
        held_out,
    )
    from gateway.evaluation.replay import paired_answers
    from policies.loader import load_policy
    from tests.benchmarks.bench_threshold_frontier import cached_units

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", action="append", required=True, help="PROTOCOL=PICKLE (bench_threshold_frontier)")
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--all", action="store_true", help="print every candidate on every unit")
    parser.add_argument(
        "--ceilings",
        action="store_true",
        help="also each unit's hindsight ceiling per ranking: the best prefix of the answers in that order, chosen "
        "with the labels (no rule can do better with that ranking), within Self-Route's tokens and within 0.3",
    )
    args = parser.parse_args()
    policy, _ = load_policy(args.policy)
    cached = cached_units(args.items)
    protocols = {p: {u: paired_answers(items) for u, (items, _) in found.items()} for p, found in cached.items()}
    # unit -> the positions of its answers (the pickles list the same answers in order)
    members = {u: positions for found in cached.values() for u, (_, positions) in found.items()}
    units = {u: a for found in protocols.values() for u, a in found.items()}
    if args.ceilings:
        _ceilings(units)
    candidates = candidate_grid(policy)
    started = time.perf_counter()
    table = evaluate_candidates(policy, units, candidates, args.seeds)
    print(
        f"{len(candidates)} candidates x {len(units)} units x {len(args.seeds)} orders in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    every = choose_relative(policy, units, candidates, args.seeds, table=table)
    for c, candidate in enumerate(candidates):
        met, _, _, worst, mean, tokens = criterion(table[c].values())
        print(
            f"== [{c}] {describe(candidate)}: both targets on {met} of {len(units)} units, worst gap {worst:+.2f}, "
            f"mean {mean:+.2f}, most tokens {-tokens:.3f}; within {sum(f.within for f in table[c].values())}, "
            f"beats Self-Route {sum(f.beats_self_route for f in table[c].values())}"
        )
        if args.all or c in (0, 1) or candidate == every.settings:
            for unit, f in table[c].items():
                print(_line(unit, f))
    print(f"== chosen on all {len(units)} units: {describe(every.settings)}")
    for protocol, found in protocols.items():
        names = sorted(found)
        sub = {c: {u: table[c][u] for u in names} for c in table}
        choice = choose_relative(policy, found, candidates, args.seeds, table=sub)
        print(f"== {protocol}: chosen on all its units: {describe(choice.settings)}; nested (held out):")
        nested = held_out(choice)
        for h in nested:
            print(_line(h.unit, h.figures) + f"  <- chosen on the others: {describe(h.settings)}")
        print(
            f"  held out: both targets on {sum(h.figures.both for h in nested)} of {len(nested)}, worst gap "
            f"{min(h.figures.gap_points[0] for h in nested):+.2f}"
        )
    # pooled: each unit chosen on every unit, of either protocol, that shares no answer with it (each scored by its
    # own protocol's out-of-fold models), so a held-out corpus is not chosen on one other corpus alone
    disjoint = {u: [v for v in units if not members[u] & members[v]] for u in units}
    print("== pooled nested: each unit chosen on every unit sharing no answer with it")
    pooled = held_out(every, disjoint)
    for h in pooled:
        print(_line(h.unit, h.figures) + f"  <- chosen on {len(h.chosen_on)} units: {describe(h.settings)}")
    print(
        f"  held out: both targets on {sum(h.figures.both for h in pooled)} of {len(pooled)}, Self-Route beaten on "
        f"{sum(h.figures.beats_self_route for h in pooled)}, worst gap {min(h.figures.gap_points[0] for h in pooled):+.2f}"
    )
    return 0


def _ceilings(units) -> None:
    """Per unit and ranking: the best quality over every prefix of the answers in ranked order (escalated: the
    prefix), vs the better baseline, within Self-Route's tokens / within 0.3 of always-long's. Non-causal and chosen
    with the labels: an upper bound for any rule escalating in that order."""
    import numpy as np

    print("== hindsight ceilings (points vs the better baseline, within Self-Route's tokens / within 0.3)")
    for unit, answers in units.items():
        s = np.array([a.score for a in answers])
        r = np.array([a.refused for a in answers], float)
        pc = np.array([a.probability for a in answers])
        cq = np.array([a.cheap_quality for a in answers])
        lq = np.array([a.long_quality for a in answers])
        ct = np.array([a.cheap_tokens for a in answers])
        lt = np.array([a.long_tokens for a in answers])
        total, best = lt.sum(), max(cq.mean(), lq.mean())
        sr_t = (ct.sum() + (r * lt).sum()) / total
        rankings = {
            "P(good)": s,
            "refusals first": s - 2 * r,
            "joint 0.5": 0.5 * s + 0.5 * pc,
            "doubt per token": -(1 - s) / lt,
            "oracle gain per token": -(lq - cq) / lt,
        }
        cells = []
        for name, key in rankings.items():
            order = np.argsort(key, kind="stable")
            tokens = (ct.sum() + np.cumsum(lt[order])) / total
            gain = np.concatenate([[0.0], np.cumsum((lq - cq)[order]) / len(answers)])
            caps = []
            for cap in (sr_t, 0.3):
                k = int(np.searchsorted(tokens, cap + 1e-12, side="right"))
                caps.append(f"{100 * (cq.mean() + gain[: k + 1].max() - best):+.2f}")
            cells.append(f"{name} {'/'.join(caps)}")
        print(f"  {unit} (cheap alone {ct.sum() / total:.3f}, Self-Route {sr_t:.3f}): " + "; ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
