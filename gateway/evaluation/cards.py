"""The parts of a model card that `selfroute train` writes from its own run: what the model was trained on (corpora,
documents against the documents available), how it held on the units it never saw, and its limitations as measured.

Cards used to be finished by hand after training (limitations, the shipped thresholds) and lost those fields
whenever the model was refitted; everything here is derived from the run's figures, so a refit rewrites it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# The targets (BENCHMARKS.md section 4): what a held-out unit's figures are judged against.
TRANSFER_TARGET_POINTS = 2.0  # verifier minus random escalation at a 25% share
BASELINE_TARGET_POINTS = -1.0  # the router against the better of always-long and always-RAG
WEAK_AUC = 0.6  # a held-out ROC AUC under this carries little signal
CURVE_CAPS = (0.1, 0.2, 0.3, 0.5, 1.0)


def documents_available(pairs: Iterable[tuple[str, Path | None]]) -> dict[str, int]:
    """Per corpus, the documents in its --docs folder (<doc_id>.txt), to say how much of it training covered."""
    out: dict[str, int] = {}
    for corpus, docs in pairs:
        if docs is not None and Path(docs).is_dir():
            out[corpus] = out.get(corpus, 0) + sum(1 for _ in Path(docs).glob("*.txt"))
    return out


def coverage_sentence(corpora: Mapping[str, Mapping[str, Any]]) -> str:
    """'Trained on N of the M documents in X's folder' for the corpora it did not cover whole."""
    partial = [
        f"{name} on {c['documents']} of the {c['documents_available']} documents in its folder"
        for name, c in sorted(corpora.items())
        if c.get("documents_available") and c["documents"] < c["documents_available"]
    ]
    return f" Trained on part of a corpus only: {'; '.join(partial)}." if partial else ""


def _units_phrase(values: Mapping[str, float], fmt: str) -> str:
    return ", ".join(f"{fmt.format(v)} with {u} held out" for u, v in sorted(values.items()))


def route_model_limitations(
    cv_metrics: Mapping[str, Any], held_out: Mapping[str, Any] | None, corpora: Mapping[str, Mapping[str, Any]]
) -> str:
    """The pre-route classifier's limitations from its figures: held-out ROC AUC (weak under WEAK_AUC) and
    accuracy against the majority rule, against the in-distribution figure; coverage of each corpus."""
    grouped = cv_metrics.get("roc_auc")
    in_dist = f" ({grouped:.3f} grouped by document, in distribution)" if grouped is not None else ""
    if not held_out:
        text = (
            "Not measured on held-out corpora or model families (train with --protocol corpus or model): its "
            f"figures are in distribution only{in_dist}."
        )
        return text + coverage_sentence(corpora)
    units = held_out["units"]
    aucs = {u: m["roc_auc"] for u, m in units.items() if m.get("roc_auc") is not None}
    text = f"Measured {held_out['protocol']}: ROC AUC {_units_phrase(aucs, '{:.3f}')}{in_dist}."
    weak = sorted(u for u, a in aucs.items() if a < WEAK_AUC)
    if weak:
        text += f" Its query and document features barely transfer to {', '.join(weak)} (ROC AUC under {WEAK_AUC:g})."
    below = sorted(
        u
        for u, m in units.items()
        if m.get("accuracy") is not None and m["accuracy"] < m.get("majority_accuracy", 0.0) - 1e-12
    )
    if below:
        text += (
            f" Held out, its accuracy at 0.5 is below always predicting the majority label on {', '.join(below)}: "
            "its threshold must be chosen on held-out scores, not read as a probability."
        )
    return text + coverage_sentence(corpora)


def curve_card(curve: Sequence[dict]) -> dict[str, dict[str, dict[str, float] | None]]:
    """The verifier's threshold curve, as its best point (points vs always-long, share escalated) within each share
    of always-long's tokens and of its cost, down to CURVE_CAPS[0]."""
    from gateway.evaluation.transfer import curve_at

    return {
        key: {
            f"{cap:g}": None if p is None else {"vs_long_points": p["vs_long_points"], "escalated": p["escalated"]}
            for cap, p in zip(CURVE_CAPS, curve_at(curve, CURVE_CAPS, key))
        }
        for key in ("tokens_vs_long", "cost_vs_long")
    }


def verifier_limitations(
    protocol: str,
    units: Mapping[str, Mapping[str, Any]],
    threshold: float,
    refusal_threshold: float | None,
    router: Mapping[str, Mapping[str, float]] | None,
    corpora: Mapping[str, Mapping[str, Any]],
) -> str:
    """The verifier's limitations from its held-out figures: its escalation against random escalation at 25%
    (the TRANSFER_TARGET_POINTS target), units where it is below random, whether its threshold escalates anything
    on its own, and, when the thresholds were chosen with the pre-route (`router`, per unit), the units where the
    router misses the baseline target or does not beat Self-Route."""
    transfer = {u: h["verifier_vs_random_points_at_25"] for u, h in units.items()}
    measured = {u: v for u, v in transfer.items() if v is not None}
    aucs = {u: h["gain_auc"] for u, h in units.items() if h.get("gain_auc") is not None}
    short = sorted(u for u, v in measured.items() if v < TRANSFER_TARGET_POINTS)
    parts = [
        f"Measured {protocol}: escalating the 25% of cheap answers it trusts least against escalating a random 25%: "
        f"{_units_phrase(measured, '{:+.2f} points')} (gain-weighted AUC {_units_phrase(aucs, '{:.3f}')})."
    ]
    if short:
        met = sorted(set(measured) - set(short))
        parts.append(
            f"Short of the {TRANSFER_TARGET_POINTS:+g}-point target on {', '.join(short)}"
            + (f" (met on {', '.join(met)})" if met else "")
            + "."
        )
    else:
        parts.append(f"The {TRANSFER_TARGET_POINTS:+g}-point target is met on every held-out unit.")
    below = sorted(u for u, v in measured.items() if v < 0)
    if below:
        parts.append(f"Below random escalation on {', '.join(below)}: its ranking does not carry over there.")
    escalated = {u: h["at_threshold"]["escalated"] for u, h in units.items()}
    if all(e == 0 for e in escalated.values()):
        parts.append(f"At its threshold ({threshold:.4f}) it escalates nothing on its own score")
    else:
        shares = ", ".join(f"{100 * e:.1f}% of {u}" for u, e in sorted(escalated.items()))
        parts.append(f"At its threshold ({threshold:.4f}) it escalates {shares}")
    parts[-1] += (
        "."
        if refusal_threshold is None
        else f"; a refusal escalates when its P(good) is below {refusal_threshold:.4f}."
    )
    if router:
        missed = sorted(u for u, o in router.items() if o["vs_better_baseline_points"] < BASELINE_TARGET_POINTS)
        not_beaten = sorted(u for u, o in router.items() if not o.get("beats_self_route"))
        if missed:
            parts.append(
                "With the pre-route at the thresholds chosen with it, the router is more than "
                f"{-BASELINE_TARGET_POINTS:g} point below the better of always-long and always-RAG on "
                + ", ".join(f"{u} ({router[u]['vs_better_baseline_points']:+.2f})" for u in missed)
                + "."
            )
        if not_beaten:
            parts.append(f"It does not beat Self-Route at no more tokens on {', '.join(not_beaten)}.")
    if short or below:
        parts.append(
            "Refit it on your own labels (selfroute learn) or calibrate on your own paired answers before relying "
            "on its threshold."
        )
    return " ".join(parts) + coverage_sentence(corpora)
