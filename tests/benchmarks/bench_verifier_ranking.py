"""Does another verifier rank cheap answers better held out (issue 19, round eight; BENCHMARKS.md section 4)?

    .venv/bin/python tests/benchmarks/bench_verifier_ranking.py --rows F.pkl \\
        [--data LEVAL/paired.jsonl --docs LEVAL/docs --data ../shared/data/lara128k/paired.jsonl \\
         --docs ../shared/data/lara128k/docs --window-tokens 16385 --window-tokens 128000 --data-dir DATA] \\
        [--variants portable,ridge-gain,...] [--slow] [--items corpus=C.pkl --items model=M.pkl --items-out DIR]

F: a pickle of every answer's verifier features (the `portable` set and the rest of classifier.answer_features),
the pre-route question features, both routes' scores and each answer's corpus, model family, document and task; read
when present, else computed from the replay's inputs under --data-dir (gateway.evaluation.verification, as
bench_transfer_features) and written. No LLM call, no fit outside this script.

For every variant, leaving one corpus out and one model family out with the replay's splits
(classifier.verifier.protocol_splits): the verifier's escalation against random escalation at a 25% share (points)
and the gain-weighted AUC per held-out unit, then each variant against `portable` (the shipped logistic): the
units it lifts to the +2 target, and the met units it loses by more than the 1-point judge noise.

Variants (each scores every answer out of fold; all but `portable` are candidates):
- portable: the shipped verifier's model (logistic over FEATURE_SETS["portable"], choice-weighted labels);
- z-whole / z-causal / rank-causal: every feature standardised (z) or ranked within its deployment, the held-out
  unit being one deployment and each training unit another. `whole` uses the unit's whole traffic (an upper bound,
  no labels); `causal` only the answers before it in stream order (the relative rule's order, seed 0) within a window
  of 1000, as a gateway's per-key window would (z-causal's training units standardised on their whole traffic,
  rank-causal's ranked the same causal way);
- unweighted: the logistic without the choice weights (what the weights buy);
- ridge-gain: a ridge regression on the gain of escalating (long score - cheap score), ranked by its negation;
- pairwise: a linear gain-weighted pairwise ranking (logistic on feature differences of random training pairs whose
  gains differ, weighted by the difference);
- question / ridge-gain+question / z-causal+question: the pre-route model's question features
  (classifier.features: question type, cues, length) added;
- in-corpus, in-corpus+support+question, in-corpus-boosting (--slow): NOT candidates, a reference: the logistic
  (over `portable`, over it with the support and question features; the boosted trees over `portable`) fitted in
  distribution, grouped 5-fold by document within each corpus, so the held-out unit's own corpus and family are in
  training. What the features carry where transfer is not the question;
- --slow: hgb-gain (boosted regression trees on the gain) and ensemble (mean rank of `portable` and the `monotonic`
  boosted trees): 40 boosted fits per model-family pass.

--items-out: bench_threshold_frontier's items (--items, the `portable` ones) with each variant's scores in place of
the verifier's, for bench_relative_threshold.py ((b) and (c) under the live relative rule). Each split's scores are
mapped to [0, 1] by the training rows' own scores (their empirical CDF), so only the warm-up's fixed thresholds see
the scale (the relative rule ranks within the key's window).
"""

from __future__ import annotations

import argparse
import bisect
import pickle
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from classifier.features import QUERY_FEATURES  # noqa: E402

# the pre-route classifier's question features, as the live classifier defines them
QUESTION_FEATURES = tuple(QUERY_FEATURES)

FAST = (
    "portable",
    "z-whole",
    "z-causal",
    "rank-causal",
    "unweighted",
    "ridge-gain",
    "pairwise",
    "question",
    "ridge-gain+question",
    "z-causal+question",
    "in-corpus",
    "in-corpus+support+question",
)
SLOW = ("hgb-gain", "ensemble", "in-corpus-boosting")
WINDOW = 1000  # the relative rule's window (policies/default.yaml)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path, required=True, help="the rows pickle: read when present, else written")
    parser.add_argument("--data", type=Path, action="append")
    parser.add_argument("--docs", type=Path, action="append")
    parser.add_argument("--window-tokens", type=int, action="append")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--variants", default=",".join(FAST), help=f"of {', '.join(FAST + SLOW)}")
    parser.add_argument("--slow", action="store_true", help=f"also {', '.join(SLOW)}")
    parser.add_argument("--protocols", default="corpus,model")
    parser.add_argument("--items", action="append", default=[], help="PROTOCOL=PICKLE (bench_threshold_frontier)")
    parser.add_argument("--items-out", type=Path, default=None)
    args = parser.parse_args()
    if args.rows.exists():
        data = pickle.loads(args.rows.read_bytes())  # this benchmark's own file, not input
    else:
        if not (args.data and args.docs and args.data_dir):
            parser.error("--rows does not exist: give --data/--docs/--data-dir to compute it")
        data = _rows(args)
        args.rows.write_bytes(pickle.dumps(data))
    variants = args.variants.split(",") + (list(SLOW) if args.slow else [])
    bench = Bench(data)
    results: dict[str, dict[str, dict[str, tuple[float, float | None]]]] = {}
    scores: dict[tuple[str, str], np.ndarray] = {}
    for protocol in args.protocols.split(","):
        print(f"\nLeave one {protocol} out: verifier - random @25% (points) / gain AUC per held-out unit", flush=True)
        for name in variants:
            started = time.time()
            s, mapped = bench.scores(protocol, name)
            scores[protocol, name] = s if name.startswith("in-corpus") else mapped
            bench.raw[protocol, name] = s
            result = bench.per_unit(protocol, s)
            results.setdefault(name, {})[protocol] = result
            met = sum(g >= 2 for g, _ in result.values())
            cells = "  ".join(f"{u} {g:+.2f} / {'-' if a is None else f'{a:.3f}'}" for u, (g, a) in result.items())
            print(f"  {name} ({time.time() - started:.0f} s, {met} >= +2): {cells}", flush=True)
    _summary(results)
    raw = {key: value for key, value in bench.raw.items()}
    if args.items:
        _ceilings(args, raw, variants)
    if args.items_out is not None:
        _write_items(args, scores, variants)
    return 0


def _rows(args) -> dict:
    """Every answer's verifier and question features, scores and units, from the replay's inputs (cached)."""
    from gateway.evaluation.examples import CorpusInputs, corpus_windows, load_corpora
    from gateway.evaluation.verification import CachedEmbed, answer_rows, cheap_answers
    from policies.loader import load_policy

    policy, _ = load_policy(None)
    examples = load_corpora(list(zip(args.data, args.docs)))
    builder = CorpusInputs(
        policy,
        args.data_dir / "lancedb",
        corpus_windows(examples, args.window_tokens),
        cache_dir=args.data_dir / "cache",
    )
    inputs = builder.all_inputs(examples, progress=False)
    answers = cheap_answers(builder, examples, embed=CachedEmbed(builder.embedder, args.data_dir / "cache"))
    return {
        "rows": answer_rows(answers, None, with_support=True),
        "question": [{k: float(i.features[k]) for k in QUESTION_FEATURES} for i in inputs],
        "rag": [float(e.record["rag_score"]) for e in examples],
        "lc": [float(e.record["lc_score"]) for e in examples],
        "corpus": [e.corpus for e in examples],
        "model": [e.model for e in examples],
        "group": [e.group for e in examples],
        "task": [e.task for e in examples],
    }


class Bench:
    def __init__(self, data: dict):
        from classifier.training import label_from_scores
        from classifier.verifier import FEATURE_SETS, choice_weights, feature_matrix, label_good

        self.rag, self.lc = np.asarray(data["rag"], float), np.asarray(data["lc"], float)
        self.gain = self.lc - self.rag
        self.y = np.asarray([label_good(r, c) for r, c in zip(self.rag, self.lc)])
        self.w = choice_weights(self.rag, self.lc)
        self.rows = data["rows"]
        self.x = feature_matrix(self.rows, FEATURE_SETS["portable"])
        self.q = feature_matrix(data["question"], QUESTION_FEATURES)
        self.group = np.asarray(data["group"])
        self.keys = {"corpus": np.asarray(data["corpus"]), "model": np.asarray(data["model"])}
        self.labels = [label_from_scores(r, c) for r, c in zip(self.rag, self.lc)]
        self.data = data
        self._splits: dict = {}
        self._norm: dict = {}
        self.raw: dict[tuple[str, str], np.ndarray] = {}  # (protocol, variant) -> its out-of-fold scores

    def splits(self, protocol: str):
        from classifier.verifier import protocol_splits

        if protocol not in self._splits:
            d = self.data
            self._splits[protocol] = protocol_splits(
                protocol, self.labels, d["group"], tasks=d["task"], corpora=d["corpus"], models=d["model"]
            )
        return self._splits[protocol]

    def normalised(self, protocol: str, kind: str) -> np.ndarray:
        """x transformed within each deployment: the protocol's units (corpus or model family)."""
        if (protocol, kind) not in self._norm:
            keys = self.keys[protocol]
            out = np.full_like(self.x, np.nan)
            for unit in sorted(set(keys.tolist())):
                idx = np.flatnonzero(keys == unit)
                if kind == "z-whole":
                    out[idx] = _z_whole(self.x[idx])
                else:
                    order = _stream(idx, self.group)
                    out[order] = (_z_causal if kind == "z-causal" else _rank_causal)(self.x[order])
            self._norm[protocol, kind] = out
        return self._norm[protocol, kind]

    def scores(self, protocol: str, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Out-of-fold scores (higher: keep the cheap answer), raw and mapped to [0, 1] by each split's training
        scores."""
        raw, mapped = np.full(len(self.y), np.nan), np.full(len(self.y), np.nan)
        if name.startswith("in-corpus"):
            return self.in_corpus(name), mapped
        for split in self.splits(protocol):
            tr, te = split.train, split.test
            train_x, test_x = self.x[tr], self.x[te]
            if name.startswith(("z-", "rank-")):
                kind = name.split("+")[0]
                train_x = self.normalised(protocol, "z-whole" if kind == "z-causal" else kind)[tr]
                test_x = self.normalised(protocol, kind)[te]
            if name.endswith("question") or name == "question":
                train_x, test_x = np.hstack([train_x, self.q[tr]]), np.hstack([test_x, self.q[te]])
            fit_on_train, scored = self._fit(name.split("+")[0], tr, te, train_x, test_x)
            raw[te] = scored
            mapped[te] = np.searchsorted(np.sort(fit_on_train), scored, side="right") / len(fit_on_train)
        return raw, mapped

    def in_corpus(self, name: str) -> np.ndarray:
        """Grouped 5-fold by document within each corpus (classifier.verifier.grouped_splits): in distribution."""
        from classifier.answer_features import SUPPORT_FEATURES
        from classifier.verifier import FEATURE_SETS, feature_matrix, grouped_splits, new_verifier

        x = self.x
        if name == "in-corpus+support+question":
            x = np.hstack([x, feature_matrix(self.rows, SUPPORT_FEATURES), self.q])
        out = np.full(len(self.y), np.nan)
        corpora = self.keys["corpus"]
        for c in sorted(set(corpora.tolist())):
            idx = np.flatnonzero(corpora == c)
            for tr, te in grouped_splits(self.y[idx], self.group[idx]):
                tr, te = idx[tr], idx[te]
                if name == "in-corpus-boosting":
                    model = new_verifier("boosting", FEATURE_SETS["portable"])
                    model.fit([self.rows[i] for i in tr], self.y[tr], self.w[tr])
                    out[te] = model.scores([self.rows[i] for i in te])
                else:
                    fitted = _logistic().fit(x[tr], self.y[tr], model__sample_weight=self.w[tr])
                    out[te] = fitted.predict_proba(x[te])[:, 1]
        return out

    def _fit(self, name: str, tr, te, train_x, test_x) -> tuple[np.ndarray, np.ndarray]:
        """(scores of the training rows, scores of the test rows) of one split's model."""
        from scipy.stats import rankdata

        if name in ("portable", "z-whole", "z-causal", "rank-causal", "question", "unweighted"):
            model = _logistic().fit(
                train_x, self.y[tr], **({} if name == "unweighted" else {"model__sample_weight": self.w[tr]})
            )
            return model.predict_proba(train_x)[:, 1], model.predict_proba(test_x)[:, 1]
        if name in ("ridge-gain", "hgb-gain"):
            model = _regressor(name).fit(train_x, self.gain[tr])
            return -model.predict(train_x), -model.predict(test_x)
        if name == "pairwise":
            return _pairwise(train_x, self.gain[tr], test_x)
        if name == "ensemble":
            from classifier.verifier import FEATURE_SETS, new_verifier

            logistic = _logistic().fit(train_x, self.y[tr], model__sample_weight=self.w[tr])
            trees = new_verifier("monotonic", FEATURE_SETS["portable"])
            trees.fit([self.rows[i] for i in tr], self.y[tr], self.w[tr])
            a = np.concatenate([logistic.predict_proba(train_x)[:, 1], logistic.predict_proba(test_x)[:, 1]])
            b = np.asarray(trees.scores([self.rows[i] for i in np.concatenate([tr, te])]))
            mean = (rankdata(a) + rankdata(b)) / (2 * len(a))
            return mean[: len(tr)], mean[len(tr) :]
        raise ValueError(f"unknown variant {name!r}")

    def per_unit(self, protocol: str, s: np.ndarray) -> dict[str, tuple[float, float | None]]:
        from classifier.verifier import escalation_gain_points, gain_auc, split_units

        units = np.asarray(split_units(self.splits(protocol), len(s)))
        out = {}
        for unit in sorted(set(units.tolist())):
            i = units == unit
            out[unit] = (
                escalation_gain_points(self.rag[i], self.lc[i], s[i], 0.25),
                gain_auc(self.rag[i], self.lc[i], s[i]),
            )
        return out


def _logistic():
    """The shipped verifier's pipeline (classifier.estimators, logistic, the verifier's settings)."""
    from classifier.estimators import VERIFIER, build_pipeline

    return build_pipeline("logistic", VERIFIER)


def _regressor(name: str):
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from classifier.estimators import VERIFIER

    impute = ("impute", SimpleImputer(strategy="median", keep_empty_features=True))
    if name == "ridge-gain":
        return Pipeline([impute, ("scale", StandardScaler()), ("model", Ridge(alpha=10.0))])
    trees = HistGradientBoostingRegressor(
        max_iter=VERIFIER.boosting_iterations,
        learning_rate=VERIFIER.boosting_learning_rate,
        max_depth=VERIFIER.boosting_max_depth,
        min_samples_leaf=VERIFIER.boosting_min_samples_leaf,
        l2_regularization=VERIFIER.boosting_l2,
        random_state=0,
    )
    return Pipeline([impute, ("model", trees)])


def _pairwise(train_x, gain, test_x, pairs: int = 50_000, seed: int = 0):
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    prep = make_pipeline(SimpleImputer(strategy="median", keep_empty_features=True), StandardScaler()).fit(train_x)
    a, b = prep.transform(train_x), prep.transform(test_x)
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(a), pairs), rng.integers(0, len(a), pairs)
    keep = gain[i] != gain[j]
    i, j = i[keep], j[keep]
    # 1: i's cheap answer is the one to keep (its escalation gains less); no intercept: a difference has none
    model = LogisticRegression(C=0.3, max_iter=3000, fit_intercept=False)
    model.fit(a[i] - a[j], (gain[i] < gain[j]).astype(int), sample_weight=np.abs(gain[i] - gain[j]))
    return a @ model.coef_[0], b @ model.coef_[0]


def _stream(idx: np.ndarray, group: np.ndarray, seed: int = 0) -> np.ndarray:
    """These answers in the relative rule's replay order (gateway.evaluation.relative_choice.stream_order)."""
    from types import SimpleNamespace

    from gateway.evaluation.relative_choice import stream_order

    return idx[stream_order([SimpleNamespace(group=str(group[i])) for i in idx.tolist()], seed)]


def _z_whole(x: np.ndarray) -> np.ndarray:
    import warnings

    with warnings.catch_warnings():  # a feature absent from a whole unit (NaN throughout) stays absent
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, sd = np.nanmean(x, 0), np.nanstd(x, 0)
    sd = np.where(sd > 1e-12, sd, 1.0)
    return (x - np.nan_to_num(mean)) / sd


def _z_causal(x: np.ndarray, min_seen: int = 20) -> np.ndarray:
    """Each row standardised by the mean and spread of the WINDOW rows before it (0 until min_seen were seen)."""
    k = x.shape[1]
    out = np.full_like(x, np.nan)
    s1, s2, n = np.zeros(k), np.zeros(k), np.zeros(k)
    for r in range(len(x)):
        v = x[r]
        present = ~np.isnan(v)
        mean = np.divide(s1, n, out=np.zeros(k), where=n > 0)
        var = np.divide(s2, n, out=np.zeros(k), where=n > 0) - mean * mean
        sd = np.sqrt(np.maximum(var, 0.0))
        sd = np.where(sd > 1e-12, sd, 1.0)
        z = (v - mean) / sd
        z[n < min_seen] = 0.0
        out[r] = np.where(present, z, np.nan)
        value = np.where(present, v, 0.0)
        s1, s2, n = s1 + value, s2 + value * value, n + present
        if r >= WINDOW:
            old = x[r - WINDOW]
            gone = ~np.isnan(old)
            value = np.where(gone, old, 0.0)
            s1, s2, n = s1 - value, s2 - value * value, n - gone
    return out


def _rank_causal(x: np.ndarray) -> np.ndarray:
    """Each row's quantile among the WINDOW rows before it (0.5 with none)."""
    out = np.full_like(x, np.nan)
    for j in range(x.shape[1]):
        seen: list[float] = []
        window: deque[float] = deque()
        for r, v in enumerate(x[:, j].tolist()):
            if v != v:  # NaN: absent, stays absent
                continue
            n = len(seen)
            lo, hi = bisect.bisect_left(seen, v), bisect.bisect_right(seen, v)
            out[r, j] = 0.5 if n == 0 else (lo + 0.5 * (hi - lo)) / n
            bisect.insort(seen, v)
            window.append(v)
            if len(window) > WINDOW:
                del seen[bisect.bisect_left(seen, window.popleft())]
    return out


def _summary(results) -> None:
    base = results.get("portable")
    units = [(p, u) for p, r in (base or next(iter(results.values()))).items() for u in r]
    print(
        "\n| variant | " + " | ".join(u for _, u in units) + " | mean | units >= +2 | lifted to +2 | met lost by > 1 |"
    )
    print("|---|" + "---|" * (len(units) + 4))
    for name, by in results.items():
        cells, met, lifted, lost, points = [], 0, [], [], []
        for p, u in units:
            if p not in by:
                cells.append("-")
                continue
            g, a = by[p][u]
            met += g >= 2
            points.append(g)
            cells.append((f"**{g:+.2f}**" if g >= 2 else f"{g:+.2f}") + f" / {'-' if a is None else f'{a:.3f}'}")
            if base is not None and p in base and not name.startswith("in-corpus"):
                b = base[p][u][0]
                if g >= 2 > b:
                    lifted.append(u)
                if b >= 2 and g < b - 1:
                    lost.append(u)
        name = f"{name} (reference, in distribution)" if name.startswith("in-corpus") else name
        print(
            f"| `{name}` | "
            + " | ".join(cells)
            + f" | {np.mean(points):+.2f} | {met} | {', '.join(lifted) or '-'} | {', '.join(lost) or '-'} |"
        )


def _ceilings(args, raw, variants) -> None:
    """(b) as far as a ranking allows: per unit, the best quality against the better of always-long and always-RAG
    when escalating the k lowest-ranked cheap answers, k chosen in hindsight, within min(0.3, Self-Route's tokens)
    of always-long's tokens (the targets (b) and (c) together); no rule can do better with that ranking."""
    from gateway.evaluation.replay import self_route

    print(
        "\n(b) ceiling of each ranking: best points vs the better baseline escalating the lowest-ranked answers, k in "
        "hindsight, tokens <= min(0.3, Self-Route's) / <= 0.3; >= -1 meets (b). `oracle (labels)`: ranked by the "
        "gain itself"
    )
    for spec in args.items:
        protocol, path = spec.split("=", 1)
        items, units = pickle.loads(Path(path).read_bytes())[:2]  # bench_threshold_frontier's file
        units = np.asarray(units)
        names = sorted(set(units.tolist()))
        print(f"| {protocol}: variant | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        gains = np.asarray([i.rag_score - i.lc_score for i in items])  # the oracle ranking: keep the best first
        for name in [*variants, "oracle (labels)"]:
            ranking = gains if name == "oracle (labels)" else raw.get((protocol, name))
            if ranking is None:
                continue
            cells = []
            for unit in names:
                idx = np.flatnonzero(units == unit)
                part = [items[i] for i in idx]
                cheap = np.asarray([i.rag_score for i in part])
                long_ = np.asarray([i.lc_score for i in part])
                cheap_tokens = np.asarray([i.rag_prompt_tokens for i in part], float)
                long_tokens = np.asarray([i.long_prompt_tokens for i in part], float)
                total = long_tokens.sum()
                sr = [self_route(i) for i in part]
                sr_t = sum(leg.prompt_tokens for o in sr for leg in o.legs) / total
                best = max(cheap.mean(), long_.mean())
                order = np.argsort(ranking[idx], kind="stable")
                quality = (cheap.sum() + np.concatenate([[0.0], np.cumsum((long_ - cheap)[order])])) / len(part)
                tokens = (cheap_tokens.sum() + np.concatenate([[0.0], np.cumsum(long_tokens[order])])) / total
                both, cap = tokens <= min(0.3, sr_t) + 1e-12, tokens <= 0.3 + 1e-12
                cells.append(
                    " / ".join(f"{100 * (quality[ok].max() - best):+.2f}" if ok.any() else "-" for ok in (both, cap))
                )
            print(f"| `{name}` | " + " | ".join(cells) + " |")


def _write_items(args, scores, variants) -> None:
    import dataclasses

    args.items_out.mkdir(parents=True, exist_ok=True)
    for spec in args.items:
        protocol, path = spec.split("=", 1)
        items, units = pickle.loads(Path(path).read_bytes())[:2]  # bench_threshold_frontier's file
        for name in variants:
            if (protocol, name) not in scores:
                continue
            new = [dataclasses.replace(i, verifier_score=float(s)) for i, s in zip(items, scores[protocol, name])]
            out = args.items_out / f"{protocol}_{name}.pkl"
            out.write_bytes(pickle.dumps((new, units)))
            print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
