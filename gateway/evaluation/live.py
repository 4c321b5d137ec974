"""`selfroute eval live`: send paired-format questions through a running gateway and score the answers.

Answers are scored against `gt` (token F1, exact match, and the option letter for multiple-choice
questions); tokens, cost and route per request come from the gateway's own ledger, looked up by the
request ids the gateway returned.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import string
import time
from pathlib import Path
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
# "C", "(C) ...", "C. ...", "Answer: C", "The correct answer is: C) ..."
_LETTER = re.compile(
    r"^\s*(?:(?:the\s+)?(?:correct\s+)?answer(?:\s+is)?\s*[:：]?\s*)?"
    r"(?:\(([A-H])\)|([A-H])(?:[.):：]|\s*$))",  # a bare "A " would be the article, not option A
    re.IGNORECASE,
)


def normalize_answer(text: str) -> list[str]:
    """SQuAD-style normalisation: lower case, no punctuation or articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    return _ARTICLES.sub(" ", text).split()


def token_f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction), normalize_answer(truth)
    if not pred or not gold:
        return float(pred == gold)
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def choice_letter(text: str) -> str | None:
    found = _LETTER.match(text or "")
    return (found.group(1) or found.group(2)).upper() if found else None


def gold_letter(truth: str) -> str | None:
    """The option letter of a multiple-choice gold answer: "C" or "(C) the option's text"."""
    found = re.match(r"^\s*\(?([A-H])\)?(?:[.)]\s|\)|\s*$)", truth or "")
    return found.group(1).upper() if found else None


def score_answer(prediction: str, truth: str) -> dict[str, float]:
    letter = gold_letter(truth)
    if letter is not None:
        correct = float(choice_letter(prediction) == letter)
        return {"score": correct, "exact_match": correct, "f1": correct}
    f1 = token_f1(prediction, truth)
    return {"score": f1, "exact_match": exact_match(prediction, truth), "f1": f1}


def register(sub, parents) -> None:
    """Adds `live` under `selfroute eval`."""
    live = sub.add_parser("live", parents=parents, help="send questions through a running gateway and score answers")
    live.add_argument(
        "--data", required=True, type=Path, help="paired-format questions (JSON lines with doc_id, query, gt)"
    )
    live.add_argument("--docs", type=Path, default=None, help="folder of <doc_id>.txt (default: DATA's folder/docs)")
    live.add_argument("--base-url", required=True, help="the gateway, e.g. http://127.0.0.1:8000/v1")
    live.add_argument("--model", default="selfroute", help="routed alias (or any model, for a baseline)")
    live.add_argument("--api-key", default=None, help="gateway key (default: $SELFROUTE_API_KEY or 'none')")
    live.add_argument("--admin-key", default=None, help="admin key for ledger look-ups (default: $SELFROUTE_ADMIN_KEY)")
    live.add_argument("--limit", type=int, default=None, help="only the first N questions")
    live.add_argument("--max-tokens", type=int, default=64)
    live.add_argument("--json", action="store_true", help="print per-question results and the summary as JSON")
    live.set_defaults(func=run_live)


def _ledger_entry(http, base: str, request_id: str, headers: dict[str, str]) -> dict[str, Any] | None:
    # the ledger is written off the request path, so a row can land a moment after the answer
    for _ in range(50):
        response = http.get(f"{base}/admin/requests/{request_id}", headers=headers)
        if response.status_code == 200:
            return response.json()
        if response.status_code != 404:
            raise RuntimeError(f"ledger look-up failed ({response.status_code}): {response.text[:200]}")
        time.sleep(0.1)
    return None


def run_live(args: argparse.Namespace) -> int:
    import httpx
    import openai
    from tqdm import tqdm

    base = args.base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    docs_dir = args.docs or args.data.parent / "docs"
    rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = rows[: args.limit] if args.limit else rows
    results = []
    with openai.OpenAI(
        base_url=base, api_key=args.api_key or os.environ.get("SELFROUTE_API_KEY") or "none", max_retries=0, timeout=600
    ) as client:
        for row in tqdm(rows, unit="q", desc="eval live", disable=args.json):
            document = (docs_dir / f"{row['doc_id']}.txt").read_text(encoding="utf-8")
            started = time.perf_counter()
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=args.model,
                    messages=[{"role": "user", "content": row["query"]}],
                    max_tokens=args.max_tokens,
                    temperature=0,
                    extra_body={"selfroute": {"documents": [{"id": row["doc_id"], "text": document}]}},
                )
                answer = raw.parse().choices[0].message.content or ""
                request_id, error = raw.headers.get("x-selfroute-request-id"), None
            except openai.APIError as exc:
                answer, error = "", str(exc)
                response = getattr(exc, "response", None)
                request_id = response.headers.get("x-selfroute-request-id") if response is not None else None
            result = {
                "doc_id": row["doc_id"],
                "query": row["query"][:200],
                "gt": row.get("gt"),
                "answer": answer,
                "error": error,
                "request_id": request_id,
                "seconds": time.perf_counter() - started,
            }
            result.update(score_answer(answer, str(row.get("gt") or "")))
            results.append(result)

    admin_key = args.admin_key or os.environ.get("SELFROUTE_ADMIN_KEY")
    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    with httpx.Client(timeout=30) as http:
        for result in results:
            entry = _ledger_entry(http, base, result["request_id"], headers) if result["request_id"] else None
            result.update(
                route=(entry or {}).get("route"),
                cost_usd=(entry or {}).get("cost_usd", 0.0),
                counterfactual_cost_usd=(entry or {}).get("counterfactual_cost_usd", 0.0),
                tokens=((entry or {}).get("prompt_tokens", 0) + (entry or {}).get("completion_tokens", 0)),
            )
    summary = summarize(results)
    if args.json:
        print(json.dumps({"summary": summary, "results": results}, indent=2))
    else:
        print_summary(summary)
    return 0


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for result in results:
        groups[result.get("route") or "unknown"].append(result)
    groups["all"] = results

    def stats(items: list[dict]) -> dict[str, float]:
        n = len(items) or 1
        return {
            "questions": len(items),
            "mean_score": sum(i["score"] for i in items) / n,
            "exact_match": sum(i["exact_match"] for i in items) / n,
            "f1": sum(i["f1"] for i in items) / n,
            "errors": sum(1 for i in items if i["error"]),
            "tokens": sum(i["tokens"] for i in items),
            "cost_usd": sum(i["cost_usd"] for i in items),
            "always_long_cost_usd": sum(i["counterfactual_cost_usd"] for i in items),
            "mean_seconds": sum(i["seconds"] for i in items) / n,
        }

    return {route: stats(items) for route, items in sorted(groups.items(), key=lambda kv: kv[0] == "all")}


def print_summary(summary: dict[str, Any]) -> None:
    print(
        f"{'route':10} {'n':>4} {'score':>6} {'EM':>6} {'F1':>6} {'err':>4} {'tokens':>9} {'cost $':>10} "
        f"{'always-long $':>13} {'s/q':>6}"
    )
    for route, s in summary.items():
        print(
            f"{route:10} {s['questions']:4d} {s['mean_score']:6.3f} {s['exact_match']:6.3f} {s['f1']:6.3f} "
            f"{s['errors']:4d} {s['tokens']:9d} {s['cost_usd']:10.6f} {s['always_long_cost_usd']:13.6f} "
            f"{s['mean_seconds']:6.2f}"
        )
