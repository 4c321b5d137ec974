"""Answer-aware verifier on L-Eval: replay of cascades that escalate the cheap answer when a learned
verifier doubts it (issue 14). No LLM is called: each strategy takes the recorded score of the route
it ends on, and pays every leg it ran (cheap leg, then long leg when escalated).

    .venv/bin/python tests/benchmarks/bench_verifier.py \
        --paired ../shared/data/leval/paired_rag_vs_lc.jsonl --leval-dir ../shared/data/leval \
        --cache-dir /tmp/verifier_lab

The first run computes routing inputs the gateway's way (document stats, a real hybrid retrieval pass
over an inline LanceDB collection with the packaged MiniLM, the RAG prompt under the default policy's
1,200-token budget, the long prompt packed into a 16,385-token window) and caches them with the
passage texts under --cache-dir; later runs read the cache.

Protocols (every score out of fold, every threshold chosen on training folds only):
- grouped 5-fold by document (seed 0);
- leave one task out: train on 8 tasks, score the 9th.
Thresholds: within each outer fold, inner out-of-fold scores on the training part (grouped 5-fold for
the first protocol, leave-one-task-out over the 8 training tasks for the second) are swept; the
threshold with the best training quality whose training cost share stays under --cost-cap is
applied to the held-out fold. The pre-route P(cheap) fed to the verifier is itself nested out of fold.
Prices: the reference pair (gpt-3.5-turbo $0.5/$1.5, gpt-3.5-turbo-16k $3/$4 per million tokens).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from classifier.answer_features import ANSWER_FEATURE_NAMES, answer_features, document_index, is_refusal  # noqa: E402
from classifier.estimators import PRE_ROUTE, VERIFIER, build_pipeline  # noqa: E402
from classifier.features import FEATURE_NAMES  # noqa: E402
from classifier.training import feature_matrix as route_matrix  # noqa: E402
from classifier.verifier import (  # noqa: E402
    VerifierModel,
    choice_weights,
    grouped_splits,
    label_good,
    leave_one_group_out_splits,
)

PRICES = {"cheap_in": 0.5, "cheap_out": 1.5, "long_in": 3.0, "long_out": 4.0}  # USD per million tokens
CACHE_NAME = "verifier_inputs_v1.jsonl"
WINDOW_TOKENS = 16385
TASK_FILES = "LEval-data"


# -- data ------------------------------------------------------------------------------------------------
def _import_builder():
    """The gateway's example builder, wherever this checkout keeps it (it is moving)."""
    try:
        from gateway.evaluation.examples import Example, RouteInputBuilder
    except ImportError:  # the layout before the move
        from gateway.route_dataset import Example, RouteInputBuilder
    return Example, RouteInputBuilder


def _reference_prices() -> dict[str, float]:
    try:
        try:
            from gateway.evaluation.prices import reference_prices
        except ImportError:
            from gateway.reference_prices import reference_prices
        p = reference_prices()
        return {
            "cheap_in": p.cheap_input,
            "cheap_out": p.cheap_output,
            "long_in": p.long_input,
            "long_out": p.long_output,
        }
    except Exception:  # no cost map available: the documented reference pair
        return dict(PRICES)


def load_rows(paired: Path, leval_dir: Path) -> tuple[list[dict], dict[str, str]]:
    """Paired rows and {doc_id: document text} from L-Eval's task files."""
    files = {p.stem: p for p in sorted((leval_dir / TASK_FILES).glob("*/*.jsonl"))}
    lines: dict[str, list[dict]] = {}
    docs: dict[str, str] = {}
    rows = []
    for line in paired.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        task = row["task"]
        if task not in lines:
            lines[task] = [json.loads(x) for x in files[task].read_text(encoding="utf-8").splitlines() if x.strip()]
        doc_id = f"{task}-{int(row['doc']):03d}"
        docs.setdefault(doc_id, lines[task][int(row["doc"])]["input"])
        row["doc_id"] = doc_id
        rows.append(row)
    return rows, docs


def _key(row: dict, doc_text: str) -> str:
    doc_hash = hashlib.sha256(doc_text.encode()).hexdigest()
    payload = [row["task"], row["doc"], row.get("question"), row["query"], doc_hash]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


def routing_inputs(rows: list[dict], docs: dict[str, str], cache_dir: Path, progress: bool = True) -> list[dict]:
    """Per row: pre-route features, RAG and long prompt tokens, the passage texts sent to the cheap model."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache_path = cache_dir / CACHE_NAME
    cache: dict[str, dict] = {}
    if cache_path.is_file():
        for line in cache_path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                cache[entry["key"]] = entry["value"]
            except (json.JSONDecodeError, KeyError):
                continue
    keys = [_key(r, docs[r["doc_id"]]) for r in rows]
    todo = [i for i, k in enumerate(keys) if k not in cache]
    if todo:
        from pipelines.documents import Document
        from policies.loader import load_policy

        Example, RouteInputBuilder = _import_builder()
        policy, _ = load_policy(None)
        builder = RouteInputBuilder(policy, cache_dir / "lancedb", window_tokens=WINDOW_TOKENS, cache_dir=cache_dir)
        started = time.time()
        with cache_path.open("a", encoding="utf-8") as out:
            for n, i in enumerate(todo, 1):
                row = rows[i]
                document = Document(id=row["doc_id"], text=docs[row["doc_id"]], title=row["doc_id"])
                example = Example(row["query"], [document], row["doc_id"], row)
                inputs = builder.inputs(example)
                retrieval = builder.rag.retrieve(builder.store.inline_collection([document]), row["query"])
                value = {
                    "features": inputs.features,
                    "rag_prompt_tokens": inputs.rag_prompt_tokens,
                    "long_prompt_tokens": inputs.long_prompt_tokens,
                    "passages": [p.text for p in retrieval.passages],
                    "hit_scores": [float(h.vector_score) for h in retrieval.hits],
                }
                out.write(json.dumps({"key": keys[i], "value": value}) + "\n")
                out.flush()
                cache[keys[i]] = value
                if progress and (n % 50 == 0 or n == len(todo)):
                    print(f"  routing inputs {n}/{len(todo)} ({time.time() - started:.0f}s)", file=sys.stderr)
    return [cache[k] for k in keys]


def output_tokens(texts: list[str]) -> list[int]:
    try:
        from pipelines.tokens import count_tokens
    except ImportError:
        return [max(1, len(t.split()) * 4 // 3) for t in texts]
    return [count_tokens(t or "") for t in texts]


# -- replay ---------------------------------------------------------------------------------------------
class Replay:
    """Recorded scores and per-leg costs; a strategy is a (escalate-or-long) decision per question."""

    def __init__(self, rows: list[dict], inputs: list[dict], prices: dict[str, float]):
        self.rag = np.array([float(r["rag_score"]) for r in rows])
        self.lc = np.array([float(r["lc_score"]) for r in rows])
        rag_out = np.array(output_tokens([r.get("rag_pred") or "" for r in rows]))
        lc_out = np.array(output_tokens([r.get("lc_pred") or "" for r in rows]))
        self.rag_cost = (
            np.array([i["rag_prompt_tokens"] for i in inputs]) * prices["cheap_in"] + rag_out * prices["cheap_out"]
        ) / 1e6
        self.long_cost = (
            np.array([i["long_prompt_tokens"] for i in inputs]) * prices["long_in"] + lc_out * prices["long_out"]
        ) / 1e6

    def outcome(self, idx, direct_long, escalate):
        """Quality and cost of questions idx: direct_long -> long only; else RAG, plus long if escalate."""
        direct_long = np.asarray(direct_long, bool)
        escalate = np.asarray(escalate, bool) & ~direct_long
        score = np.where(direct_long | escalate, self.lc[idx], self.rag[idx])
        cost = np.where(direct_long, self.long_cost[idx], self.rag_cost[idx] + escalate * self.long_cost[idx])
        return score, cost

    def summary(self, idx, direct_long, escalate) -> dict[str, float]:
        score, cost = self.outcome(idx, direct_long, escalate)
        long_q, long_c = self.lc[idx].mean(), self.long_cost[idx].sum()
        return {
            "quality": score.mean(),
            "points": 100 * (score.mean() - long_q),
            "cost_share": cost.sum() / long_c,
            "long_share": float(np.mean(np.asarray(direct_long, bool) | np.asarray(escalate, bool))),
        }


def pick_threshold(replay: Replay, idx, scores, cost_cap: float, direct_long=None) -> float:
    """On training questions idx with their inner out-of-fold scores: the threshold (escalate when
    score < t) with the best quality among those whose cost share stays within cost_cap."""
    scores = np.asarray(scores, float)
    direct_long = np.zeros(len(idx), bool) if direct_long is None else np.asarray(direct_long, bool)
    candidates = np.unique(np.concatenate([[0.0], np.quantile(scores, np.linspace(0, 1, 201)), [1.0 + 1e-9]]))
    best_t, best_q = 0.0, -np.inf
    for t in candidates:
        s = replay.summary(idx, direct_long, scores < t)
        if s["cost_share"] <= cost_cap and s["quality"] > best_q + 1e-12:
            best_t, best_q = float(t), s["quality"]
    return best_t


# -- models ---------------------------------------------------------------------------------------------
def fit_predict_route(x, y, train, test, seed=0):
    if len(set(y[train].tolist())) < 2:
        return np.full(len(test), float(y[train][0]))
    pipe = build_pipeline("boosting", PRE_ROUTE, seed).fit(x[train], y[train])
    return pipe.predict_proba(x[test])[:, list(pipe.classes_).index(1)]


def fit_predict_verifier(rows, y, w, train, test, names, estimator="boosting", seed=0):
    if len(set(y[train].tolist())) < 2:
        return np.full(len(test), float(y[train][0]))
    model = VerifierModel(build_pipeline(estimator, VERIFIER, seed), list(names))
    model.fit([rows[i] for i in train], y[train], None if w is None else w[train])
    return np.asarray(model.scores([rows[i] for i in test]))


def inner_splits(protocol: str, idx, y, docs, tasks, seed=0):
    """Splits of training questions idx (positions into idx), mirroring the outer protocol."""
    if protocol == "loto":
        return leave_one_group_out_splits(tasks[idx])
    return grouped_splits(y[idx], docs[idx], 5, seed)


def outer_splits(protocol: str, y, docs, tasks, seed=0):
    if protocol == "loto":
        return leave_one_group_out_splits(tasks)
    return grouped_splits(y, docs, 5, seed)


def nested_pre_route(protocol, x_route, y, docs, tasks):
    """Outer folds with the pre-route P(cheap): inner out-of-fold on each training part (so features of
    training questions are honest too), and from a model of the whole training part for its test part."""
    folds = []
    for train, test in outer_splits(protocol, y, docs, tasks):
        inner = inner_splits(protocol, train, y, docs, tasks)
        pre_train = np.zeros(len(train))
        for itr, ite in inner:
            pre_train[ite] = fit_predict_route(x_route, y, train[itr], train[ite])
        folds.append(
            {
                "train": train,
                "test": test,
                "inner": inner,
                "pre_train": pre_train,
                "pre_test": fit_predict_route(x_route, y, train, test),
            }
        )
    return folds


def nested_verifier(folds, ans_rows, y, w, names, use_pre_route, estimator="boosting"):
    """Per outer fold: verifier scores of the test part (model of the training part) and inner
    out-of-fold scores of the training part (to choose the threshold)."""
    out = []
    for f in folds:
        train, test = f["train"], f["test"]
        rows = list(ans_rows)
        for pos, i in enumerate(train):
            rows[i] = dict(ans_rows[i], pre_route_probability=f["pre_train"][pos] if use_pre_route else np.nan)
        for pos, i in enumerate(test):
            rows[i] = dict(ans_rows[i], pre_route_probability=f["pre_test"][pos] if use_pre_route else np.nan)
        ver_train = np.zeros(len(train))
        for itr, ite in f["inner"]:
            ver_train[ite] = fit_predict_verifier(rows, y, w, train[itr], train[ite], names, estimator)
        out.append(
            dict(f, ver_train=ver_train, ver_test=fit_predict_verifier(rows, y, w, train, test, names, estimator))
        )
    return out


def evaluate_protocol(
    protocol, replay, x_route, ans_rows, y, w, docs, tasks, refused, variants, cost_cap, pre_route_share=0.10
):
    """Rows of the results table for one protocol, and the per-question decisions of each strategy."""
    n = len(y)
    all_idx = np.arange(n)
    results, decisions = {}, {}

    def record(name, direct_long, escalate):
        results[name] = replay.summary(all_idx, direct_long, escalate)
        decisions[name] = (np.asarray(direct_long, bool), np.asarray(escalate, bool))

    zeros, ones = np.zeros(n, bool), np.ones(n, bool)
    record("always-long", ones, zeros)
    record("always-rag", zeros, zeros)
    record("self-route (escalate refusals)", zeros, refused)
    # pre-route classifier + Self-Route fallback, threshold at the shipped 10% long share of training scores
    base = nested_pre_route(protocol, x_route, y, docs, tasks)
    direct = np.zeros(n, bool)
    pre_oof = np.zeros(n)
    for f in base:
        t = np.quantile(f["pre_train"], pre_route_share)
        direct[f["test"]] = f["pre_test"] < t
        pre_oof[f["test"]] = f["pre_test"]
    record("pre-route classifier + fallback (10% long)", direct, refused & ~direct)
    # pre-route classifier alone with a threshold chosen under the cost cap (no answer seen)
    direct2 = np.zeros(n, bool)
    for f in base:
        tr = f["train"]
        cands = np.unique(np.quantile(f["pre_train"], np.linspace(0, 1, 101)))
        best_t, best_q = 0.0, -np.inf
        for t in cands:
            s = replay.summary(tr, f["pre_train"] < t, np.zeros(len(tr), bool))
            if s["cost_share"] <= cost_cap and s["quality"] > best_q:
                best_t, best_q = t, s["quality"]
        direct2[f["test"]] = f["pre_test"] < best_t
    record("pre-route classifier (threshold under cost cap)", direct2, zeros)
    scores_out = {"pre-route": pre_oof}
    for name, (names, use_pre, weighted, estimator) in variants.items():
        folds = nested_verifier(base, ans_rows, y, w if weighted else None, names, use_pre, estimator)
        esc = np.zeros(n, bool)
        oof = np.zeros(n)
        thresholds = []
        for f in folds:
            t = pick_threshold(replay, f["train"], f["ver_train"], cost_cap)
            thresholds.append(t)
            esc[f["test"]] = f["ver_test"] < t
            oof[f["test"]] = f["ver_test"]
        record(name, zeros, esc)
        results[name]["thresholds"] = thresholds
        scores_out[name] = oof
    oracle_long = replay.lc > replay.rag
    record("oracle (better route per question)", oracle_long, zeros)
    return results, decisions, scores_out


# -- reporting --------------------------------------------------------------------------------------------
def table(results: dict[str, dict]) -> str:
    head = f"| {'strategy':<52} | quality | vs long (pts) | cost vs long | long/escalated % |"
    lines = [head, "|" + "-" * 54 + "|---------|---------------|--------------|------------------|"]
    for name, r in results.items():
        lines.append(
            f"| {name:<52} | {r['quality']:.4f}  | {r['points']:+13.2f} | {r['cost_share']:12.3f} | "
            f"{100 * r['long_share']:16.1f} |"
        )
    return "\n".join(lines)


def per_task_table(replay, tasks, decisions, names) -> str:
    out = ["| task | n | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for task in sorted(set(tasks.tolist())):
        idx = np.flatnonzero(tasks == task)
        cells = []
        for name in names:
            d, e = decisions[name]
            s = replay.summary(idx, d[idx], e[idx])
            cells.append(f"{s['quality']:.3f} ({100 * s['long_share']:.0f}%)")
        out.append(f"| {task} | {len(idx)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def permutation_importance(replay, ans_rows, y, w, docs, tasks, names, pre_oof, repeats=3, seed=0):
    """Grouped 5-fold AUC and weighted-decision gain lost when one feature is shuffled in the test fold."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    rows = [dict(r, pre_route_probability=p) for r, p in zip(ans_rows, pre_oof)]
    x = np.asarray([[r.get(nm, np.nan) for nm in names] for r in rows], float)
    base_oof = np.zeros(len(y))
    models = []
    for train, test in grouped_splits(y, docs, 5, 0):
        pipe = build_pipeline("boosting", VERIFIER, 0)
        pipe.fit(x[train], y[train], model__sample_weight=w[train])
        base_oof[test] = pipe.predict_proba(x[test])[:, 1]
        models.append((pipe, test))
    gain = replay.rag - replay.lc

    def utility(scores):  # weighted ranking quality: AUC of "escalate-worthy" weighted by |gain|
        mask = gain != 0
        return roc_auc_score((gain[mask] > 0).astype(int), scores[mask], sample_weight=np.abs(gain[mask]))

    base = utility(base_oof)
    out = []
    for j, nm in enumerate(names):
        drops = []
        for _ in range(repeats):
            perm = base_oof.copy()
            for pipe, test in models:
                xt = x[test].copy()
                xt[:, j] = xt[rng.permutation(len(test)), j]
                perm[test] = pipe.predict_proba(xt)[:, 1]
            drops.append(base - utility(perm))
        out.append((nm, float(np.mean(drops))))
    return base, sorted(out, key=lambda t: -t[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paired", type=Path, required=True, help="paired_rag_vs_lc.jsonl")
    parser.add_argument("--leval-dir", type=Path, required=True, help="folder holding LEval-data/")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/verifier_lab"))
    parser.add_argument(
        "--cost-cap-grouped",
        type=float,
        default=0.35,
        help="grouped 5-fold thresholds: best training quality with training cost share <= this "
        "(default 0.35: the 0.40 target less a margin)",
    )
    parser.add_argument(
        "--cost-cap-loto",
        type=float,
        default=0.45,
        help="leave-one-task-out thresholds: the same under this cap (default 0.45: the 0.50 target less a margin)",
    )
    parser.add_argument("--margin", type=float, default=0.0, help="label: good when rag_score >= lc_score - margin")
    parser.add_argument("--importance", action="store_true", help="also print permutation importances")
    parser.add_argument("--ablations", action="store_true", help="also replay feature-group and label ablations")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    started = time.time()
    rows, docs = load_rows(args.paired, args.leval_dir)
    inputs = routing_inputs(rows, docs, args.cache_dir)
    t_inputs = time.time() - started
    prices = _reference_prices()
    replay = Replay(rows, inputs, prices)
    doc_index = {d: document_index(t) for d, t in docs.items()}
    ans_rows = []
    for r, inp in zip(rows, inputs):
        terms, bigrams, nums = doc_index[r["doc_id"]]
        f = answer_features(
            r["query"],
            r.get("rag_pred"),
            inp["passages"],
            None,
            None,
            None,
            document_terms_set=terms,
            document_bigrams=bigrams,
            document_numbers=nums,
        )
        f.update(inp["features"])  # pre-route features, for variants that use them
        ans_rows.append(f)
    y = np.array([label_good(r["rag_score"], r["lc_score"], args.margin) for r in rows])
    w = choice_weights(replay.rag, replay.lc)
    docs_arr = np.array([r["doc_id"] for r in rows])
    tasks = np.array([r["task"] for r in rows])
    refused = np.array([is_refusal(r.get("rag_pred")) for r in rows])
    x_route = route_matrix([i["features"] for i in inputs])
    answer_only = [n for n in ANSWER_FEATURE_NAMES if n != "pre_route_probability"]
    full = list(ANSWER_FEATURE_NAMES)
    variants = {
        "verifier only (answer features)": (answer_only, False, True, "boosting"),
        "pre-route + verifier": (full + FEATURE_NAMES, True, True, "boosting"),
    }
    if args.ablations:
        groups = {
            "refusal/hedge": [n for n in full if n.startswith(("ans_refusal", "ans_hedges", "ans_missing"))],
            "multiple choice": [n for n in full if n.startswith("mc_")],
            "grounding": [
                n for n in full if "support" in n or n in ("ans_unsupported_terms", "passage_share_of_document")
            ],
            "shape": ["ans_words", "ans_log_chars", "ans_numbers", "ans_query_len_ratio", "ans_query_overlap"],
        }
        variants.update(
            {
                "ablation: unweighted label": (full + FEATURE_NAMES, True, False, "boosting"),
                "ablation: logistic": (full + FEATURE_NAMES, True, True, "logistic"),
                "ablation: pre-route P only, no raw pre-route features": (full, True, True, "boosting"),
                **{
                    f"ablation: without {g}": (
                        [n for n in full + FEATURE_NAMES if n not in drop],
                        True,
                        True,
                        "boosting",
                    )
                    for g, drop in groups.items()
                },
                "ablation: pre-route P + shape only": (
                    ["pre_route_probability"] + groups["shape"],
                    True,
                    True,
                    "boosting",
                ),
            }
        )
    print(
        f"{len(rows)} questions, {len(docs)} documents, {len(set(tasks.tolist()))} tasks; "
        f"{int(refused.sum())} cheap answers are refusals; label: rag_score >= lc_score - {args.margin:g} "
        f"({100 * y.mean():.1f}% good); prices {prices}; threshold cost caps {args.cost_cap_grouped} (grouped), "
        f"{args.cost_cap_loto} (LOTO)"
    )
    report = {}
    for protocol, title in (("grouped", "Grouped-by-document 5-fold"), ("loto", "Leave-one-task-out")):
        t0 = time.time()
        cap = args.cost_cap_loto if protocol == "loto" else args.cost_cap_grouped
        results, decisions, scores = evaluate_protocol(
            protocol, replay, x_route, ans_rows, y, w, docs_arr, tasks, refused, variants, cap
        )
        print(f"\n## {title} ({time.time() - t0:.0f}s)\n")
        print(table(results))
        for name, r in results.items():
            if "thresholds" in r:
                print(f"  {name}: thresholds per fold {[round(t, 3) for t in r['thresholds']]}")
        if protocol == "loto":
            print("\nPer task (LOTO; quality, long/escalated share):\n")
            show = [
                "always-long",
                "always-rag",
                "self-route (escalate refusals)",
                "pre-route classifier + fallback (10% long)",
                "verifier only (answer features)",
                "pre-route + verifier",
                "oracle (better route per question)",
            ]
            print(per_task_table(replay, tasks, decisions, show))
        report[protocol] = {k: {kk: vv for kk, vv in v.items()} for k, v in results.items()}
        if protocol == "grouped":
            pre_oof = scores["pre-route"]
    if args.importance:
        names = list(ANSWER_FEATURE_NAMES) + FEATURE_NAMES
        base, imp = permutation_importance(replay, ans_rows, y, w, docs_arr, tasks, names, pre_oof)
        print(f"\nPermutation importance (grouped 5-fold, pre-route + verifier; gain-weighted AUC {base:.3f}):")
        for nm, drop in imp:
            if abs(drop) >= 0.0005:
                print(f"  {nm:<32} {drop:+.4f}")
    print(f"\nruntime: routing inputs {t_inputs:.0f}s, total {time.time() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
