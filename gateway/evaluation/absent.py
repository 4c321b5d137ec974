"""Measure the keep-refusal option on questions that truly have no answer (SQuAD 2.0 format).

No model answers here, so what is measured is the option's *decision*: suppose the cheap route
refused; would the router keep that refusal (evidence says the answer is absent) or escalate to the
long route? For truly unanswerable questions keeping is right (escalating costs a long call for
nothing); for answerable ones keeping would lose an answer the long route might have found. Each
article is one context (its paragraphs are the documents); features and retrieval are the gateway's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gateway.evaluation.examples import Example
from pipelines.documents import Document


@dataclass
class AbsentQuestion:
    article: str
    query: str
    impossible: bool
    features: dict[str, float]
    probability: float | None


def load_squad(path: str | Path) -> list[tuple[Example, bool]]:
    """(example, is_impossible) for every question; an example's documents are its article's paragraphs."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for article in data["data"]:
        title = article["title"]
        docs = [
            Document(id=f"{title}-p{i:03d}", text=p["context"], title=title)
            for i, p in enumerate(article["paragraphs"])
        ]
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                out.append((Example(qa["question"], docs, title, qa), bool(qa.get("is_impossible"))))
    return out


def _auc(positive: list[float], negative: list[float]) -> float | None:
    """P(a positive scores above a negative), ties half: the ROC AUC without sklearn's label plumbing."""
    if not positive or not negative:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


@dataclass
class AbsentReport:
    n_unanswerable: int
    n_answerable: int
    max_top_score: float
    min_probability: float
    kept_unanswerable: int  # option on: refusals kept on truly unanswerable questions
    kept_answerable: int  # option on: refusals that would be kept on answerable questions
    mean_top_score: dict[str, float]
    auc_for_absent: dict[str, float | None]  # how well each signal separates unanswerable (higher = better)
    sweep: list[dict] = field(default_factory=list)

    def lines(self) -> list[str]:
        u, a = self.n_unanswerable, self.n_answerable
        out = [
            f"questions: {u} truly unanswerable, {a} answerable",
            "option off: every refusal escalates to the long route "
            f"(unanswerable: 0 kept / {u} escalated; answerable: 0 kept / {a} escalated)",
            f"option on (top_score <= {self.max_top_score:g} and P(cheap) >= {self.min_probability:g}): "
            f"unanswerable {self.kept_unanswerable} kept / {u - self.kept_unanswerable} escalated "
            f"({100 * self.kept_unanswerable / max(u, 1):.1f}% kept); answerable {self.kept_answerable} kept / "
            f"{a - self.kept_answerable} escalated ({100 * self.kept_answerable / max(a, 1):.1f}% would lose the "
            "long route's chance)",
            "mean top_score: " + ", ".join(f"{k} {v:.3f}" for k, v in self.mean_top_score.items()),
            "AUC for telling unanswerable from answerable (0.5 = no signal): "
            + ", ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in self.auc_for_absent.items()),
        ]
        if self.sweep:
            out.append(
                "absent_max_top_score sweep (P(cheap) condition as configured): "
                + "; ".join(
                    f"<= {s['max_top_score']:.2f}: keeps {100 * s['kept_unanswerable']:.0f}% "
                    f"unanswerable / {100 * s['kept_answerable']:.0f}% answerable"
                    for s in self.sweep
                )
            )
        return out


def absent_report(questions: list[AbsentQuestion], fallback) -> AbsentReport:
    from gateway.routing.escalation import refusal_evidence

    unans = [q for q in questions if q.impossible]
    ans = [q for q in questions if not q.impossible]

    def kept(group, settings) -> int:
        return sum(refusal_evidence(q.features, q.probability, settings) for q in group)

    def values(group, name):
        return [float(q.features[name]) for q in group if q.features.get(name) == q.features.get(name)]

    signals = {
        "-top_score": lambda g: [-v for v in values(g, "top_score")],
        "-term_coverage": lambda g: [-v for v in values(g, "term_coverage")],
        "-top_margin": lambda g: [-v for v in values(g, "top_margin")],
        "P(cheap)": lambda g: [q.probability for q in g if q.probability is not None],
    }
    sweep = []
    for cut in (0.3, 0.4, 0.5, 0.6, 0.7):
        settings = fallback.model_copy(update={"absent_max_top_score": cut})
        sweep.append(
            {
                "max_top_score": cut,
                "kept_unanswerable": kept(unans, settings) / max(len(unans), 1),
                "kept_answerable": kept(ans, settings) / max(len(ans), 1),
            }
        )
    mean = {
        name: sum(v) / len(v) if (v := values(group, "top_score")) else float("nan")
        for name, group in (("unanswerable", unans), ("answerable", ans))
    }
    return AbsentReport(
        n_unanswerable=len(unans),
        n_answerable=len(ans),
        max_top_score=fallback.absent_max_top_score,
        min_probability=fallback.absent_min_probability,
        kept_unanswerable=kept(unans, fallback),
        kept_answerable=kept(ans, fallback),
        mean_top_score=mean,
        auc_for_absent={k: _auc(fn(unans), fn(ans)) for k, fn in signals.items()},
        sweep=sweep,
    )
