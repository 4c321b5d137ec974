"""Grounding check (pipelines.safety.grounding) on HotpotQA and SQuAD 2.0 (not collected by pytest).

Labelled (claim, passages) pairs, label 1 = supported:

* hotpot_sent: passages = the two gold paragraphs; supported = their supporting-fact sentences (verbatim);
  unsupported = sentences of the distractor paragraphs (same topic family, retrieved as distractors by HotpotQA).
* hotpot_qa: claim = "question — answer." (yes/no answers skipped); supported with the gold paragraphs as passages,
  unsupported with the two first distractor paragraphs as passages.
* numswap: each supported hotpot_sent sentence that holds a number, with that number changed (unsupported).
* squad_sent (held out): claim = "question — answer."; supported with the sentence that holds the answer as
  passage, unsupported with another sentence of the same paragraph (answerable questions of the SQuAD 2.0 subset).

The threshold is chosen on the HotpotQA sets (max F1 for flagging unsupported claims) and then applied unchanged to
SQuAD. Latency: check() of a 4-sentence answer against the five passages of a SQuAD-sized request, real embedder.

    HF_HUB_OFFLINE=1 .venv/bin/python tests/benchmarks/bench_grounding.py --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pipelines.safety import grounding  # noqa: E402
from pipelines.safety.grounding import GroundingChecker, split_sentences  # noqa: E402


def auc(scores: list[float], labels: list[int]) -> float:
    """ROC AUC of score as evidence of label 1 (Mann-Whitney, ties count half)."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=int)
    order = s.argsort(kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = y == 1
    n1, n0 = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)) if n1 and n0 else float("nan")


def flag_metrics(scores: list[float], labels: list[int], threshold: float) -> dict:
    """Precision/recall of flagging UNSUPPORTED (score < threshold) claims."""
    flagged = [s < threshold for s in scores]
    unsupported = [y == 0 for y in labels]
    tp = sum(f and u for f, u in zip(flagged, unsupported))
    fp = sum(f and not u for f, u in zip(flagged, unsupported))
    fn = sum((not f) and u for f, u in zip(flagged, unsupported))
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {
        "precision": p,
        "recall": r,
        "f1": 2 * p * r / (p + r) if p + r else 0.0,
        "supported_kept": 1 - fp / max(1, sum(labels)),
    }


def qa_claim(question: str, answer: str) -> str:
    return f"{question.strip().rstrip('?')} — {answer.strip()}."


def swap_number(sentence: str, rng: random.Random) -> str | None:
    found = list(re.finditer(r"\b\d+\b", sentence))
    if not found:
        return None
    m = rng.choice(found)
    value = int(m.group(0))
    new = value + rng.choice([1, 2, 3, 7, 10]) if value < 1000 else value + rng.choice([1, 2, 5, 11])
    return sentence[: m.start()] + str(new) + sentence[m.end() :]


def hotpot_sets(path: Path, rng: random.Random, per_question_negatives: int = 4):
    data = json.loads(path.read_text())
    sent, qa, numswap = [], [], []
    for item in data:
        gold = [" ".join(s.strip() for s in item["para_a"]), " ".join(s.strip() for s in item["para_b"])]
        facts = [item["para_a"][i].strip() for i in item["supporting_facts"][0] if i < len(item["para_a"])]
        facts += [item["para_b"][i].strip() for i in item["supporting_facts"][1] if i < len(item["para_b"])]
        for f in facts:
            sent.append((f, gold, 1))
            swapped = swap_number(f, rng)
            if swapped:
                numswap.append((swapped, gold, 0))
        distractor_sents = [s.strip() for entry in item["distractors"] for s in entry[1] if len(s.split()) >= 5]
        for s in rng.sample(distractor_sents, min(per_question_negatives, len(distractor_sents))):
            sent.append((s, gold, 0))
        if item["answer"].lower() not in ("yes", "no"):
            claim = qa_claim(item["question"], item["answer"])
            qa.append((claim, gold, 1))
            distractors = [
                " ".join(s.strip() for s in para) for para in (entry[1] for entry in item["distractors"][:2])
            ]
            qa.append((claim, distractors, 0))
    return {"hotpot_sent": sent, "hotpot_qa": qa, "numswap": numswap}


def squad_set(path: Path, rng: random.Random):
    data = json.loads(path.read_text())
    pairs, paragraphs = [], []
    for article in data["data"]:
        for para in article["paragraphs"]:
            ctx = para["context"]
            spans = split_sentences(ctx)
            paragraphs.append((ctx, para["qas"]))
            if len(spans) < 2:
                continue
            for qa in para["qas"]:
                if qa.get("is_impossible") or not qa["answers"]:
                    continue
                start = qa["answers"][0]["answer_start"]
                holder = [k for k, (a, b) in enumerate(spans) if a <= start < b]
                if not holder:
                    continue
                k = holder[0]
                answer = qa["answers"][0]["text"]
                others = [
                    j
                    for j in range(len(spans))
                    if j != k and answer.lower() not in ctx[spans[j][0] : spans[j][1]].lower()
                ]
                if not others:
                    continue
                claim = qa_claim(qa["question"], answer)
                a, b = spans[k]
                pairs.append((claim, [ctx[a:b]], 1))
                a, b = spans[rng.choice(others)]
                pairs.append((claim, [ctx[a:b]], 0))
    return pairs, paragraphs


class CachedEmbed:
    def __init__(self, embed):
        self.inner = embed
        self.cache: dict[str, np.ndarray] = {}

    def prefill(self, texts: list[str]) -> None:
        missing = sorted({t for t in texts if t not in self.cache})
        for i in range(0, len(missing), 256):
            chunk = missing[i : i + 256]
            for t, v in zip(chunk, self.inner(chunk)):
                self.cache[t] = v

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.prefill(texts)
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, 384), dtype=np.float32)


def score_pairs(checker: GroundingChecker, pairs) -> list[float]:
    out = []
    for claim, passages, _ in pairs:
        report = checker.check(claim, passages)
        checked = report.checked
        out.append(min(s.score for s in checked) if checked else 1.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--latency-runs", type=int, default=40)
    args = ap.parse_args()
    data = Path(args.data)
    rng = random.Random(args.seed)

    from pipelines.embedding import Embedder

    embedder = Embedder()
    t0 = time.perf_counter()
    embedder.embed(["warm up"])
    print(f"model load {time.perf_counter() - t0:.1f}s")

    sets = hotpot_sets(data / "hotpotqa_dev_sample100" / "camera_ready_nd8_dev_sample100.json", rng)
    squad_pairs, squad_paragraphs = squad_set(data / "squad2_dev_subset" / "dev-v2.0.first2articles.json", rng)
    sets["squad_sent"] = squad_pairs
    for name, pairs in sets.items():
        print(f"{name}: {len(pairs)} pairs, {sum(p[2] for p in pairs)} supported")

    cached = CachedEmbed(embedder.embed)
    texts: list[str] = []
    for pairs in sets.values():
        for claim, passages, _ in pairs:
            texts.append(claim)
            texts += grounding.passage_windows(passages)[0]
    t0 = time.perf_counter()
    cached.prefill(texts)
    print(f"embedded {len(cached.cache)} unique texts in {time.perf_counter() - t0:.1f}s")

    variants = {
        "semantic only": dict(semantic_weight=1.0, lexical_weight=0.0, number_cap=1.0),
        "lexical only": dict(semantic_weight=0.0, lexical_weight=1.0, number_cap=1.0),
        "0.6 sem + 0.4 lex": dict(semantic_weight=0.6, lexical_weight=0.4, number_cap=1.0),
        "0.6 sem + 0.4 lex + number cap (default)": dict(),
        "0.8 sem + 0.2 lex + number cap": dict(semantic_weight=0.8, lexical_weight=0.2),
        "0.4 sem + 0.6 lex + number cap": dict(semantic_weight=0.4, lexical_weight=0.6),
    }
    calib_names = ("hotpot_sent", "hotpot_qa", "numswap")
    print("\nROC AUC (score as evidence of support)")
    print(f"{'variant':44s} " + " ".join(f"{n:>11s}" for n in sets) + f" {'hotpot all':>11s}")
    default_scores = {}
    for label, opts in variants.items():
        checker = GroundingChecker(cached, **opts)
        scores = {n: score_pairs(checker, p) for n, p in sets.items()}
        hot_s = sum((scores[n] for n in calib_names), [])
        hot_y = sum(([p[2] for p in sets[n]] for n in calib_names), [])
        aucs = [
            auc(scores[n], [p[2] for p in sets[n]]) if len({p[2] for p in sets[n]}) > 1 else float("nan") for n in sets
        ]
        print(f"{label:44s} " + " ".join(f"{a:11.3f}" for a in aucs) + f" {auc(hot_s, hot_y):11.3f}")
        if not opts:
            default_scores = scores

    hot_s = sum((default_scores[n] for n in calib_names), [])
    hot_y = sum(([p[2] for p in sets[n]] for n in calib_names), [])
    best = max((flag_metrics(hot_s, hot_y, t)["f1"], t) for t in np.arange(0.20, 0.90, 0.01))
    threshold = round(float(best[1]), 2)
    print(f"\nthreshold chosen on HotpotQA (max F1 of flagging unsupported): {threshold}")
    for t in sorted({threshold, grounding.DEFAULT_THRESHOLD, 0.4, 0.45, 0.55, 0.6}):
        print(f"  threshold {t:.2f}")
        for n in sets:
            m = flag_metrics(default_scores[n], [p[2] for p in sets[n]], t)
            print(
                f"    {n:12s} flag-unsupported precision {m['precision']:.3f} recall {m['recall']:.3f} "
                f"F1 {m['f1']:.3f}  supported kept {m['supported_kept']:.3f}"
            )

    # latency: a 4-sentence answer vs 5 passages (SQuAD paragraphs), real embedder, no cache
    checker = GroundingChecker(embedder.embed, threshold=threshold)
    times = []
    for _ in range(args.latency_runs):
        picks = rng.sample(squad_paragraphs, 5)
        passages = [p[0] for p in picks]
        ctx = picks[0][0]
        sents = [ctx[a:b] for a, b in split_sentences(ctx)][:3]
        answer = " ".join(sents + ["The company reported revenue of 41 million dollars in 1997."])
        t0 = time.perf_counter()
        checker.check(answer, passages)
        times.append(time.perf_counter() - t0)
    times.sort()
    print(
        f"\nlatency per answer (4 sentences vs 5 passages, {args.latency_runs} runs, CPU): "
        f"median {statistics.median(times) * 1000:.0f} ms, p90 {times[int(0.9 * len(times)) - 1] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
