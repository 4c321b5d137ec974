"""Per held-out unit (a corpus, a model family, a task or a fold): does routing hold where it was not trained?

For the replay's items scored out of fold under a protocol (classifier.verifier.protocol_splits), each unit's
items were scored by models that never saw that unit. Per unit:

- the transfer figure: escalating the share s of cheap answers the verifier trusts least (lowest P(good)) against
  escalating a random share s. Random escalation's expected quality is exact, mean(rag) + s * (mean(long) -
  mean(rag)), so no sampling enters; the figure is the verifier's quality minus that, in points, at 25% and along
  the shares;
- the gain-weighted AUC of P(good): how well it orders the answers where escalating changes the score (ties
  left out, each weighted by |rag_score - lc_score|; 0.5 = no signal);
- the replay's strategies on the unit alone (always-long, always-RAG, Self-Route, the router at the policy's
  thresholds, the oracle: gateway.evaluation.replay), tokens and cost against the unit's always-long;
- the verifier's threshold curve (every question RAG first): quality, tokens and cost at each threshold, from no
  escalation (always-RAG's cost, well under 10% of always-long's on long documents) up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.evaluation.replay import Prices, ReplayItem, StrategyResult, run_strategies
from gateway.evaluation.tradeoff import Table, quantile_grid
from policies.schema import Policy

SHARES = (0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.40, 0.50)
TRANSFER_SHARE = 0.25


@dataclass
class UnitReport:
    unit: str
    n: int
    documents: int
    strategies: list[StrategyResult]
    transfer: list[dict]  # {share, verifier, random, points}
    transfer_points: float | None  # at TRANSFER_SHARE
    gain_auc: float | None
    curve: list[dict] = field(default_factory=list)  # the verifier's threshold curve (every question RAG first)

    def strategy(self, name: str) -> StrategyResult | None:
        return next((s for s in self.strategies if s.name == name), None)

    def strategy_named(self, name: str) -> StrategyResult:
        """The named strategy, which every report has (the replay's fixed strategies); KeyError otherwise."""
        found = self.strategy(name)
        if found is None:
            raise KeyError(f"no strategy {name!r} in unit {self.unit}")
        return found

    def to_dict(self) -> dict:
        return {
            "unit": self.unit,
            "n": self.n,
            "documents": self.documents,
            "strategies": [s.to_dict() for s in self.strategies],
            "transfer": self.transfer,
            "transfer_points_at_25": self.transfer_points,
            "gain_auc": self.gain_auc,
            "curve": self.curve,
        }


def escalation_transfer(items: Sequence[ReplayItem], shares: Sequence[float] = SHARES) -> list[dict]:
    """The verifier's escalation of the lowest-P(good) share against random escalation of the same share."""
    import numpy as np

    rag = np.array([i.rag_score for i in items], float)
    lc = np.array([i.lc_score for i in items], float)
    scores = np.array([math.inf if i.verifier_score is None else i.verifier_score for i in items], float)
    n = len(items)
    order = np.argsort(scores, kind="stable")
    gain = lc - rag
    out = []
    for share in shares:
        k = int(round(share * n))
        verifier = float(rag.mean() + gain[order[:k]].sum() / n)
        random = float(rag.mean() + (k / n) * gain.mean())
        out.append(
            {
                "share": share,
                "escalated": k,
                "verifier": verifier,
                "random": random,
                "points": 100 * (verifier - random),
            }
        )
    return out


def gain_weighted_auc(items: Sequence[ReplayItem]) -> float | None:
    """ROC AUC of P(good) for "the cheap answer is at least as good" over the items where the routes differ,
    each weighted by how much the choice changes the score."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    rows = [
        (float(i.rag_score >= i.lc_score), abs(i.rag_score - i.lc_score), i.verifier_score)
        for i in items
        if i.rag_score != i.lc_score and i.verifier_score is not None
    ]
    if len({r[0] for r in rows}) < 2:
        return None
    y, w, s = (np.array(c, float) for c in zip(*rows))
    return float(roc_auc_score(y, s, sample_weight=w))


def threshold_curve(items: Sequence[ReplayItem], prices: Prices, steps: int = 60) -> list[dict]:
    """Quality, tokens and cost of 'every question RAG first, escalate below the threshold' across thresholds."""
    from policies.routes import RAG

    table = Table(items, prices)
    routes = [RAG] * len(items)
    long_q = float(table.lc.mean())
    points = []
    for t in quantile_grid([i.verifier_score for i in items], steps):
        o = table.outcome(routes, t)
        points.append(
            {
                "threshold": t,
                "quality": o["quality"],
                "vs_long_points": 100 * (o["quality"] - long_q),
                "tokens_vs_long": o["tokens_vs_long"],
                "cost_vs_long": o["cost_vs_long"],
                "escalated": o["long_share"],
            }
        )
    return points


def unit_reports(
    items: Sequence[ReplayItem], units: Sequence[str], policy: Policy, prices: Prices, verifier_threshold: float | None
) -> list[UnitReport]:
    out = []
    for unit in sorted(set(units)):
        part = [i for i, u in zip(items, units) if u == unit]
        has_scores = any(i.verifier_score is not None for i in part)
        out.append(
            UnitReport(
                unit=unit,
                n=len(part),
                documents=len({i.group for i in part}),
                strategies=run_strategies(part, policy, prices, verifier_threshold),
                transfer=escalation_transfer(part) if has_scores else [],
                transfer_points=(
                    next(t["points"] for t in escalation_transfer(part, (TRANSFER_SHARE,))) if has_scores else None
                ),
                gain_auc=gain_weighted_auc(part) if has_scores else None,
                curve=threshold_curve(part, prices) if has_scores else [],
            )
        )
    return out


UNIT_COLUMNS = [
    ("always-long", "always-long"),
    ("always-rag", "always-RAG"),
    ("self-route", "Self-Route"),
    ("rules+classifier+verifier", "router"),
    ("verifier only (rag, then verifier)", "verifier only"),
    ("oracle", "oracle"),
]


def format_units(reports: Sequence[UnitReport], label: str) -> str:
    """One row per held-out unit: quality of each strategy, the router's tokens and cost, the transfer figure."""
    head = [
        label,
        "n",
        *[c for _, c in UNIT_COLUMNS],
        "router tokens / cost vs long",
        "router escalated",
        "verifier − random @25% (pts)",
        "gain AUC",
    ]
    rows = [head]
    for r in reports:
        router = r.strategy("rules+classifier+verifier") or r.strategy("router (rules+classifier+fallback)")
        cells = []
        for name, _ in UNIT_COLUMNS:
            s = r.strategy(name)
            cells.append("–" if s is None else f"{s.quality:.4f}")
        escalated = (
            100 * (router.route_shares.get("rag>long", 0.0) + router.route_shares.get("long", 0.0))
            if router
            else math.nan
        )
        rows.append(
            [
                r.unit,
                str(r.n),
                *cells,
                f"{router.tokens_vs_long:.3f} / {router.cost_vs_long:.3f}" if router else "–",
                f"{escalated:.1f}%",
                "–" if r.transfer_points is None else f"{r.transfer_points:+.2f}",
                "–" if r.gain_auc is None else f"{r.gain_auc:.3f}",
            ]
        )
    return _table(rows)


def format_transfer_curve(reports: Sequence[UnitReport]) -> str:
    """The verifier minus random escalation (points) at each share, per unit."""
    if not any(r.transfer for r in reports):
        return ""
    shares = [t["share"] for t in next(r.transfer for r in reports if r.transfer)]
    rows = [["unit", *[f"{100 * s:.0f}%" for s in shares]]]
    for r in reports:
        if r.transfer:
            rows.append([r.unit, *[f"{t['points']:+.2f}" for t in r.transfer]])
    return _table(rows)


def curve_at(curve: Sequence[dict], cost_shares: Sequence[float], key: str = "cost_vs_long") -> list[dict | None]:
    """The best point of a threshold curve within each cost (or token) share."""
    out = []
    for cap in cost_shares:
        within = [p for p in curve if p[key] <= cap + 1e-12]
        out.append(max(within, key=lambda p: (p["quality"], -p[key])) if within else None)
    return out


def format_threshold_curves(
    reports: Sequence[UnitReport],
    caps: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0),
    key: str = "cost_vs_long",
) -> str:
    """Per unit: the verifier-only curve's best quality (points vs always-long) within each share of always-long."""
    if not any(r.curve for r in reports):
        return ""
    rows = [["unit", *[f"≤{c:g}" for c in caps]]]
    for r in reports:
        if not r.curve:
            continue
        cells = []
        for p in curve_at(r.curve, caps, key):
            cells.append("–" if p is None else f"{p['vs_long_points']:+.2f} ({100 * p['escalated']:.0f}%)")
        rows.append([r.unit, *cells])
    return _table(rows)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
