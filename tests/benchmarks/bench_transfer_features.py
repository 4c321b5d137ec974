"""Which verifier features hold across corpora and model families (issue 19 item 3; BENCHMARKS.md section 4, "What
transfers, round five"). No LLM call: the recorded cheap answers of paired files, with the passages, retrieval pass
and document index the replay computes (gateway.evaluation.verification, cached under --data-dir).

    .venv/bin/python tests/benchmarks/bench_transfer_features.py \\
        --data LEVAL/paired.jsonl --docs LEVAL/docs --data ../shared/data/lara128k/paired.jsonl \\
        --docs ../shared/data/lara128k/docs --window-tokens 16385 --window-tokens 128000 --data-dir DATA

Prints (1) each answer feature alone as a score: its gain-weighted AUC on every corpus and on every model family of
each corpus (0.5: no signal; a feature above 0.5 on one corpus and below on the other learns a corpus's style), and
(2) for feature sets and estimators: the verifier's escalation against random escalation at a 25% share and the
gain-weighted AUC on every held-out unit, leaving one corpus out and one model family out, with the replay's splits,
weights and figures (classifier.verifier.protocol_splits / protocol_scores).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from classifier.answer_features import ANSWER_FEATURE_NAMES, PORTABLE_SIGNALS, SUPPORT_FEATURES  # noqa: E402
from classifier.training import label_from_scores  # noqa: E402
from classifier.verifier import (  # noqa: E402
    FEATURE_SETS,
    SIGN_FLIP_FEATURES,
    TRANSFER_FEATURE_NAMES,
    choice_weights,
    escalation_gain_points,
    gain_auc,
    label_good,
    protocol_scores,
    protocol_splits,
    split_units,
)
from gateway.evaluation.examples import CorpusInputs, corpus_windows, load_corpora  # noqa: E402
from gateway.evaluation.verification import CachedEmbed, answer_rows, cheap_answers, protocol_inputs  # noqa: E402
from policies.loader import load_policy  # noqa: E402

# the sets compared: the shipped one, it without the reversing features, and the portable one
SETS = {
    "transfer": list(TRANSFER_FEATURE_NAMES),
    "transfer-reversing": [n for n in TRANSFER_FEATURE_NAMES if n not in SIGN_FLIP_FEATURES],
    "portable": list(FEATURE_SETS["portable"]),
    # with the answer's support in embedding space (an embedding pass over the answers and their sentences, cached
    # under --data-dir; the chunks sent read from the store): BENCHMARKS.md section 4, "Round six"
    "portable+support": list(FEATURE_SETS["portable+support"]),
    "transfer+support": list(FEATURE_SETS["transfer+support"]),
    "support": list(SUPPORT_FEATURES),
}


def directions(rows, rag, lc, corpora, models) -> None:
    corpora, models = np.asarray(corpora), np.asarray(models)
    units = [(c, corpora == c) for c in sorted(set(corpora.tolist()))]
    for c in sorted(set(corpora.tolist())):
        families = sorted(set(models[corpora == c].tolist()))
        if len(families) > 1:
            units += [(f"{c}:{m}", (corpora == c) & (models == m)) for m in families]
    print("Each feature alone as P(good): gain-weighted AUC per corpus and model family (R: reverses between corpora)")
    print("| feature | R | " + " | ".join(u for u, _ in units) + " |")
    print("|---|---|" + "---|" * len(units))
    for name in ANSWER_FEATURE_NAMES:
        x = np.asarray([r[name] for r in rows], float)
        cells = []
        for _, mask in units:
            ok = mask & ~np.isnan(x)
            cells.append(gain_auc(rag[ok], lc[ok], x[ok]) if ok.sum() > 50 and len(set(x[ok].tolist())) > 1 else None)
        by_corpus = [a for a in cells[: len(set(corpora.tolist()))] if a is not None]
        reverses = len(by_corpus) > 1 and min(by_corpus) < 0.48 and max(by_corpus) > 0.52
        print(
            f"| {name} | {'R' if reverses else ''} | "
            + " | ".join("–" if a is None else f"{a:.3f}" for a in cells)
            + " |"
        )


def held_out(rows, y, w, rag, lc, splits, names, estimator) -> dict[str, tuple[float, float | None]]:
    scores = protocol_scores(rows, y, splits, estimator=estimator, feature_names=names, sample_weight=w)
    units = np.asarray(split_units(splits, len(y)))
    return {
        u: (
            escalation_gain_points(rag[units == u], lc[units == u], scores[units == u], 0.25),
            gain_auc(rag[units == u], lc[units == u], scores[units == u]),
        )
        for u in sorted(set(units.tolist()))
    }


def held(builder: CorpusInputs, examples: list) -> list:
    """The examples whose document set the store holds as an inline collection with its chunks."""
    store = next(iter(builder.builders.values())).store
    known: dict[tuple, bool] = {}
    for e in examples:
        key = tuple(e.doc_ids)
        if key not in known:
            info = store.collection(store.inline_name(e.documents))
            known[key] = info is not None and info.chunk_count > 0
    kept = [e for e in examples if known[tuple(e.doc_ids)]]
    print(
        f"held only: {len(kept)} of {len(examples)} answers, {sum(known.values())} of {len(known)} document sets",
        flush=True,
    )
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, action="append", required=True)
    parser.add_argument("--docs", type=Path, action="append", required=True)
    parser.add_argument("--window-tokens", type=int, action="append", default=None)
    parser.add_argument("--data-dir", type=Path, required=True, help="the replay's routing-input cache")
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--estimators", default="boosting,logistic")
    parser.add_argument("--protocols", default="corpus,model")
    parser.add_argument("--progress", action="store_true", help="progress bars on stderr")
    parser.add_argument(
        "--held-only",
        action="store_true",
        help="only the answers whose documents the store under --data-dir holds embedded (no document is embedded "
        "again: the support reads the chunks sent from the store)",
    )
    args = parser.parse_args()
    started = time.time()
    policy, _ = load_policy(args.policy)
    examples = load_corpora(list(zip(args.data, args.docs)))
    builder = CorpusInputs(
        policy,
        args.data_dir / "lancedb",
        corpus_windows(examples, args.window_tokens),
        cache_dir=args.data_dir / "cache",
    )
    if args.held_only:
        examples = held(builder, examples)
    support = any(set(SETS[name]) & set(SUPPORT_FEATURES) for name in args.sets.split(","))
    embed = CachedEmbed(builder.embedder, args.data_dir / "cache") if support else None
    answers = cheap_answers(builder, examples, progress=args.progress, embed=embed)
    if support:
        print(f"inputs and the support's embedding pass: {time.time() - started:.0f} s", flush=True)
    rows = answer_rows(answers, None, with_support=support)
    rag = np.asarray([float(e.record["rag_score"]) for e in examples])
    lc = np.asarray([float(e.record["lc_score"]) for e in examples])
    y = np.asarray([label_good(r, c) for r, c in zip(rag, lc)])
    w = choice_weights(rag, lc)
    print(
        f"{len(examples)} answers, inputs in {time.time() - started:.0f} s; new signals: {', '.join(PORTABLE_SIGNALS)}"
    )
    directions(rows, rag, lc, [e.corpus for e in examples], [e.model for e in examples])
    labels = [label_from_scores(r, c) for r, c in zip(rag, lc)]
    groups = [e.group for e in examples]
    for protocol in args.protocols.split(","):
        splits = protocol_splits(protocol, labels, groups, **protocol_inputs(examples))
        print(f"\nLeave one {protocol} out: verifier − random @25% (points) / gain AUC per held-out unit")
        for estimator in args.estimators.split(","):
            for name in args.sets.split(","):
                t = time.time()
                result = held_out(rows, y, w, rag, lc, splits, SETS[name], estimator)
                cells = "  ".join(f"{u} {g:+.2f} / {'–' if a is None else f'{a:.3f}'}" for u, (g, a) in result.items())
                print(f"  {name} ({estimator}, {time.time() - t:.0f} s): {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
