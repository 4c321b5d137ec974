"""Build replay items from paired examples, and print or plot the replay's results."""

from __future__ import annotations

import logging
from pathlib import Path

from gateway.evaluation.replay import GapRecovery, LongCache, ReplayItem, StrategyResult, cacheable_block

log = logging.getLogger(__name__)


def build_items(examples, inputs, probabilities, detector, verifier_scores=None) -> list[ReplayItem]:
    """verifier_scores: the verifier's P(good) of each recorded RAG answer, when a verifier is replayed."""
    from pipelines.tokens import count_tokens

    items = []
    verifier_scores = verifier_scores if verifier_scores is not None else [None] * len(examples)
    for example, inp, p, v in zip(examples, inputs, probabilities, verifier_scores):
        record = example.record
        rag_pred, lc_pred = record.get("rag_pred"), record.get("lc_pred")
        items.append(
            ReplayItem(
                doc_id="+".join(example.doc_ids),
                group=example.group,
                query=example.query,
                rag_score=float(record["rag_score"]),
                lc_score=float(record["lc_score"]),
                # without a recorded RAG answer nothing can be said to refuse
                rag_refused=detector.is_unanswerable(rag_pred) if rag_pred is not None else False,
                rag_prompt_tokens=inp.rag_prompt_tokens,
                long_prompt_tokens=inp.long_prompt_tokens,
                direct_prompt_tokens=inp.direct_prompt_tokens,
                rag_output_tokens=count_tokens(rag_pred or ""),
                long_output_tokens=count_tokens(lc_pred or ""),
                features=inp.features,
                probability=float(p),
                task=record.get("task"),
                verifier_score=None if v is None else float(v),
                long_prefix_tokens=inp.long_prefix_tokens or 0,
            )
        )
    return items


def format_table(results: list[StrategyResult]) -> str:
    routes = sorted({r for res in results for r in res.route_shares})
    head = [
        "strategy",
        "quality",
        "vs long (pts)",
        *[f"{r} %" for r in routes],
        "tokens vs long",
        "cost $",
        "cost vs long",
    ]
    rows = [head]
    for res in results:
        rows.append(
            [
                res.name,
                f"{res.quality:.4f}",
                f"{res.quality_vs_long_points:+.2f}",
                *[f"{100 * res.route_shares.get(r, 0.0):.1f}" for r in routes],
                f"{res.tokens_vs_long:.3f}",
                f"{res.cost_usd:.4f}",
                f"{res.cost_vs_long:.3f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_cache(cache: LongCache | None, items: list[ReplayItem]) -> str:
    """One line: how long legs are priced with respect to the provider's prompt cache."""
    if cache is None:
        return "prompt cache: off (every long leg priced cold; --prompt-cache on to price a warm cache)"
    blocks = [cacheable_block(i, cache) for i in items]
    cacheable = [b for b in blocks if b]
    write = "writes at the input price" if cache.write is None else f"write {cache.write:g}/M"
    window = (
        "the whole replay" if cache.window is None else f"{cache.window} questions after a document's last long leg"
    )
    return (
        f"prompt cache: read {cache.read:g}/M, {write} ({cache.source}); warm for {window}; "
        f"{len(cacheable)} of {len(items)} questions have a cacheable document block"
        + (f" (mean {sum(cacheable) / len(cacheable):,.0f} tokens)" if cacheable else "")
    )


def format_per_task(results: list[StrategyResult], items: list[ReplayItem]) -> str:
    """One row per task, one column per strategy: quality (share answered long, directly or escalated)."""
    tasks = sorted({i.task or "all" for i in items})
    counts = {t: sum(1 for i in items if (i.task or "all") == t) for t in tasks}
    head = ["task", "n", *[r.name for r in results]]
    rows = [head] + [
        [t, str(counts[t]), *[f"{r.per_task[t]:.3f} ({100 * r.per_task_long[t]:.0f}%)" for r in results]] for t in tasks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_gap(gap: GapRecovery) -> str:
    def pct(value):
        return "not reached" if value is None else f"{100 * value:.1f}% long calls"

    if gap.apgr is None:
        return (
            f"gap recovery: always-long ({gap.quality_long:.4f}) is not better than always-RAG "
            f"({gap.quality_rag:.4f}); nothing to recover"
        )
    return (
        f"gap recovery (classifier alone, RAG vs long; RouteLLM metrics): quality RAG {gap.quality_rag:.4f} -> "
        f"long {gap.quality_long:.4f}; CPT(50%) {pct(gap.cpt50)}, CPT(80%) {pct(gap.cpt80)}; "
        f"APGR {gap.apgr:.3f} (random 0.500, oracle ordering {gap.apgr_oracle:.3f})"
    )


def plot_curve(path: Path, curves: dict[str, list[dict]], points: list[StrategyResult], title: str) -> None:
    try:
        import matplotlib
    except ImportError:  # an optional extra: the server and the rest of the CLI never need it
        raise RuntimeError("--plot needs matplotlib: pip install 'selfroute[eval]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    for label, curve in curves.items():
        ordered = sorted(curve, key=lambda p: p["cost_vs_long"])
        ax.plot([p["cost_vs_long"] for p in ordered], [p["quality"] for p in ordered], "-", lw=1.5, label=label)
    markers = "osD^v<>Pp*"
    for i, res in enumerate(points):
        ax.plot(res.cost_vs_long, res.quality, markers[i % len(markers)], ms=8, label=res.name)
    ax.set_xlabel("cost relative to always-long")
    ax.set_ylabel("mean quality (recorded score)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")  # the empty corner: costly, and no better than the curve
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
