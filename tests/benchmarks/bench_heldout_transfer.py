"""Target (a) of issue 19 per held-out unit from scored items, side by side for several item files (BENCHMARKS.md
section 4, round nine: the same protocols with fp32 and with int8 retrieval).

    .venv/bin/python tests/benchmarks/bench_heldout_transfer.py \\
        --items fp32:corpus=C32.pkl --items fp32:model=M32.pkl --items int8:corpus=C8.pkl --items int8:model=M8.pkl

Each file: the scored items `tests/benchmarks/bench_threshold_frontier.py --items-cache F --protocol corpus|model
--features portable --verifier-estimator logistic --no-sweep` writes (out-of-fold P(good) under the protocol). Printed
per unit and label: escalating the verifier's least-trusted 25% against escalating a random 25% (points,
gateway.evaluation.transfer.escalation_transfer, as `eval replay` reports it; target >= +2) and the gain-weighted
AUC. Targets (b) and (c) under the shipped relative rule: bench_relative_threshold.py on the same files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    from gateway.evaluation.cards import TRANSFER_TARGET_POINTS
    from gateway.evaluation.transfer import escalation_transfer, gain_weighted_auc
    from tests.benchmarks.bench_threshold_frontier import cached_units

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", action="append", required=True, help="LABEL:PROTOCOL=PICKLE")
    args = parser.parse_args()

    labels: list[str] = []
    figures: dict[tuple[str, str], tuple[int, float, float | None]] = {}
    units: list[str] = []
    for spec in args.items:
        label, rest = spec.split(":", 1)
        if label not in labels:
            labels.append(label)
        for unit, (items, _) in next(iter(cached_units([rest]).values())).items():
            if unit not in units:
                units.append(unit)
            [at25] = escalation_transfer(items, shares=[0.25])
            figures[label, unit] = (len(items), at25["points"], gain_weighted_auc(items))
    print(f"(a) verifier - random escalation at a 25% share, points (target >= +{TRANSFER_TARGET_POINTS:g}); AUC")
    print("| unit | n | " + " | ".join(f"{label} (a) | {label} AUC" for label in labels) + " |")
    print("|---|---:|" + "---:|---:|" * len(labels))
    for unit in units:
        n = next(figures[label, unit][0] for label in labels if (label, unit) in figures)
        cells = []
        for label in labels:
            found = figures.get((label, unit))
            if found is None:
                cells += ["–", "–"]
            else:
                met = "" if found[1] >= TRANSFER_TARGET_POINTS else " (missed)"
                cells += [f"{found[1]:+.2f}{met}", "–" if found[2] is None else f"{found[2]:.3f}"]
        print(f"| {unit} | {n} | " + " | ".join(cells) + " |")
    for label in labels:
        met = sum(1 for u in units if (label, u) in figures and figures[label, u][1] >= TRANSFER_TARGET_POINTS)
        print(f"{label}: (a) met on {met} of {sum(1 for u in units if (label, u) in figures)} units")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
