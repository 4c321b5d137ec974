"""Pick the classifier threshold that sends a target share of requests to the long route."""

from __future__ import annotations

import math
from collections.abc import Sequence


def calibrate_threshold(probabilities: Sequence[float], target_long_share: float) -> float:
    """Threshold t such that the share of P(cheap) < t (routed long) is as close to the target as the
    data allows. Deterministic: the k-th smallest probability with k = round(share * n), so exactly k
    values lie below it unless probabilities tie there (ties all go the same way)."""
    if not 0.0 <= target_long_share <= 1.0:
        raise ValueError(f"target_long_share must be within [0, 1], got {target_long_share}")
    values = sorted(float(p) for p in probabilities if not math.isnan(float(p)))
    if not values:
        raise ValueError("no probabilities to calibrate on")
    k = round(target_long_share * len(values))
    if k <= 0:
        return 0.0
    if k >= len(values):
        # everything must fall below: just above the largest probability, kept a valid threshold
        return min(1.0, math.nextafter(values[-1], math.inf))
    return values[k]


def long_share(probabilities: Sequence[float], threshold: float) -> float:
    """Share of requests the threshold routes long (P(cheap) < threshold)."""
    values = [float(p) for p in probabilities]
    return sum(p < threshold for p in values) / len(values) if values else 0.0
