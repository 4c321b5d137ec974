"""Explain's long-route cost estimate against the cost the ledger then records, in a working session on L-Eval documents.

Not collected by pytest. A live gateway (real uvicorn, the official `openai` client) in front of the fake upstream
(tests/support/fake_upstream.py), made to count like a provider for this figure: usage is counted with tiktoken (the
gateway's counter) and its prompt cache behaves like

* OpenAI (`--provider openai`, gpt-4.1 list prices): a prompt whose first >= 1024 tokens match an earlier prompt has
  the matching prefix, in 128-token steps, reported as `prompt_tokens_details.cached_tokens`;
* Anthropic (`--provider anthropic`, claude-sonnet-4-5 list prices, `cache_control` on the document block): the
  marked block reported as `cache_creation_input_tokens` the first time, `cache_read_input_tokens` after.

The session asks the first --documents L-Eval documents that fit the window, up to --questions of each, one document
after the other, on the long route. Before each question `POST /v1/route/explain` estimates it; then it is asked and
its leg's recorded cost read from the ledger. Prompt-side costs are compared (the estimate's completion is the
request's max_tokens, the fake's answer is an echo), with the estimate priced as before this change (no cache) beside.

    .venv/bin/python tests/benchmarks/bench_warm_estimate.py --data ../shared/data/leval --provider anthropic
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import openai  # noqa: E402

import tests.support.fake_upstream as fake  # noqa: E402
from gateway.server.app import create_app  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from pipelines.messages import content_text, count_message_tokens  # noqa: E402
from pipelines.tokens import count_tokens, encoding  # noqa: E402
from tests.support.policies import DROP, fake_route, make_policy  # noqa: E402
from tests.support.servers import serve_app  # noqa: E402

PROVIDERS = {  # $/M tokens: input, cache read, cache write, output (litellm's cost map, as in BENCHMARKS.md §8)
    "openai": ("fake-long-prefix-cache", False, 2.00, 0.50, 2.00, 8.00),
    "anthropic": ("fake-long", True, 3.00, 0.30, 3.75, 15.00),
}
MAX_TOKENS = 64


def usage_for(body: dict, answer: str) -> dict:
    prompt, completion = count_message_tokens(body["messages"]), count_tokens(answer)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def cache_usage(state, body: dict) -> dict:
    """tests.support.fake_upstream.cache_usage counted in tiktoken tokens, with OpenAI's minimum and 128-token steps."""
    usage: dict = {}
    text, marked = "", None
    for m in body["messages"]:
        parts = m.get("content") if isinstance(m.get("content"), list) else [{"text": m.get("content") or ""}]
        for part in parts:
            text += content_text([part])
            if isinstance(part, dict) and part.get("cache_control"):
                marked = text
    if marked is not None:
        tokens = count_tokens(marked)
        usage["cache_read_input_tokens" if marked in state.prompt_cache else "cache_creation_input_tokens"] = tokens
        state.prompt_cache.add(marked)
    if "prefix-cache" in body["model"]:
        ids = encoding().encode(text, disallowed_special=())
        seen = state.prefixes.setdefault(body["model"], [])
        shared = 0
        for earlier in seen:
            n = 0
            while n < min(len(ids), len(earlier)) and ids[n] == earlier[n]:
                n += 1
            shared = max(shared, n)
        seen.append(ids)
        usage["prompt_tokens_details"] = {"cached_tokens": (shared // 128) * 128 if shared >= 1024 else 0}
    return usage


def session(data: Path, documents: int, questions: int, max_tokens: int):
    """(doc id, text, [questions]) of the first `documents` L-Eval documents under max_tokens."""
    rows = [json.loads(line) for line in (data / "paired_rag_vs_lc.jsonl").open(encoding="utf-8") if line.strip()]
    files = {p.stem: p for p in (data / "LEval-data").glob("*/*.jsonl")}
    sources: dict[str, list[dict]] = {}
    asked: dict[tuple, list[str]] = {}
    for row in rows:
        asked.setdefault((row["task"], int(row["doc"])), []).append(row["query"])
    for (task, doc), queries in asked.items():
        if task not in sources:
            sources[task] = [json.loads(x) for x in files[task].open(encoding="utf-8") if x.strip()]
        text = sources[task][doc]["input"]
        if len(queries) < 2 or count_tokens(text) > max_tokens:
            continue
        yield f"{task}-{doc:03d}", text, queries[:questions]
        documents -= 1
        if documents == 0:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/leval"))
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="anthropic")
    parser.add_argument("--documents", type=int, default=6)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--window", type=int, default=32_000)
    args = parser.parse_args()
    fake.usage_for, fake.cache_usage = usage_for, cache_usage  # looked up at call time by the fake's handler
    model, marked, price_in, price_read, price_write, price_out = PROVIDERS[args.provider]
    upstream = fake.create_fake_upstream()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, serve_app(upstream) as base:
        policy = make_policy(
            base,
            name="warm-estimate-bench",
            cheap=fake_route(base, "fake-cheap", input_cost_per_mtok=0.15, output_cost_per_mtok=0.6),
            long=fake_route(
                base,
                model,
                cache_control=marked,
                input_cost_per_mtok=price_in,
                cached_input_cost_per_mtok=price_read,
                cache_write_cost_per_mtok=price_write,
                output_cost_per_mtok=price_out,
                context_window=args.window,
            ),
            passthrough=DROP,
        )
        app = create_app(Settings(data_dir=Path(tmp)), policy=policy)
        with serve_app(app) as url:
            while httpx.get(f"{url}/health/readiness").status_code != 200:
                time.sleep(0.5)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
            rows = []
            for doc_id, text, queries in session(args.data, args.documents, args.questions, args.window - 2000):
                docs = [{"id": doc_id, "text": text}]
                for question in queries:
                    body = {
                        "model": "selfroute",
                        "max_tokens": MAX_TOKENS,
                        "messages": [{"role": "user", "content": question}],
                        "selfroute": {"documents": docs, "route": "long"},
                    }
                    estimate = httpx.post(
                        f"{url}/v1/route/explain", json=body, timeout=600, headers={"authorization": "Bearer bench"}
                    ).json()["estimates"]["long"]
                    client.chat.completions.create(
                        model="selfroute",
                        max_tokens=MAX_TOKENS,
                        messages=body["messages"],
                        extra_body={"selfroute": body["selfroute"]},
                    )
                    app.state.gateway.ledger.flush()
                    with sqlite3.connect(app.state.gateway.ledger.path) as conn:
                        cost, completion, cached = conn.execute(
                            "SELECT cost_usd, completion_tokens, cached_tokens FROM upstream_calls "
                            "ORDER BY id DESC LIMIT 1"
                        ).fetchone()
                    out = estimate["completion_tokens_estimate"] * price_out / 1e6
                    rows.append(
                        (
                            doc_id,
                            estimate["cache"],
                            estimate["cost_usd"] - out,
                            estimate["cost_usd_uncached"] - out,
                            cost - completion * price_out / 1e6,
                            estimate["cached_tokens_estimate"],
                            cached,
                        )
                    )
    elapsed = time.perf_counter() - started
    print(
        f"{args.provider}: {len(rows)} questions on {len({r[0] for r in rows})} documents, window {args.window:,}; "
        f"prices $/M input {price_in}, cache read {price_read}, cache write {price_write}; {elapsed:.0f} s"
    )
    print(
        f"{'document':22s} {'cache':6s} {'estimate':>10s} {'uncached':>10s} {'recorded':>10s} {'est. cached':>11s} "
        f"{'reported':>9s}"
    )
    for doc_id, state, estimate, uncached, recorded, cached_estimate, cached in rows:
        print(
            f"{doc_id:22s} {state:6s} {estimate:10.5f} {uncached:10.5f} {recorded:10.5f} {cached_estimate:11,d} "
            f"{cached:9,d}"
        )
    recorded = sum(r[4] for r in rows)
    for name, column in (("cache-aware estimate", 2), ("uncached estimate", 3)):
        total = sum(r[column] for r in rows)
        errors = [abs(r[column] - r[4]) / r[4] for r in rows]
        print(
            f"{name:21s} total ${total:.4f} vs recorded ${recorded:.4f} ({100 * (total - recorded) / recorded:+.1f}%); "
            f"per question: median error {100 * statistics.median(errors):.1f}%, "
            f"within 5% on {sum(e <= 0.05 for e in errors)}/{len(errors)}"
        )
    states = [r[1] for r in rows]
    print("estimates: " + ", ".join(f"{s} {states.count(s)}" for s in ("warm", "cold", "not_cacheable")))


if __name__ == "__main__":
    main()
