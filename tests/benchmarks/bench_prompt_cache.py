"""Provider prompt caching on the long route: a replay of L-Eval's repeated questions per document.

Not collected by pytest. Every question of --data (paired_rag_vs_lc.jsonl; 1,328 questions on 181 documents) is
sent to the long route in file order, which asks a document's questions one after another. Each prompt is what the
gateway builds (pipelines.long_context: instructions, the labelled document units, then the question) for a
128k-token window; every L-Eval document fits, so a document's prompts share the whole document block. Completion
tokens are the length of L-Eval's recorded long-context answer (lc_pred). Tokens are counted with tiktoken (the
gateway's counter); Anthropic's tokenizer differs by a few per cent.

Prices are litellm's cost map (the published list prices the gateway's ledger uses):

* OpenAI gpt-4.1, automatic prefix caching: a prompt whose first >= 1024 tokens match a recent prompt has the
  matching prefix, in 128-token steps, billed at the cached rate;
* Anthropic claude-sonnet-4-5, `cache_control` on the document block (what the gateway sends): the first question
  on a document writes the block to the cache (1.25x input), the next ones read it (0.1x).

Both assume the cache is still warm for the next question on the same document (Anthropic's TTL is 5 minutes,
refreshed by each hit; OpenAI's 5-10 minutes idle): a replay of a session, not of questions days apart. The cold
column prices the same prompts without any cache.

    .venv/bin/python tests/benchmarks/bench_prompt_cache.py --data ../shared/data/leval
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.ledger.pricing import PriceBook  # noqa: E402
from pipelines.documents import Document  # noqa: E402
from pipelines.long_context import pack_long_context, split_question  # noqa: E402
from pipelines.settings import LongContextSettings  # noqa: E402
from pipelines.tokens import count_tokens  # noqa: E402
from policies.schema import ModelConfig  # noqa: E402

WINDOW = 128_000
OPENAI_MIN_PREFIX, OPENAI_STEP = 1024, 128


def prompts(data: Path):
    """(doc key, question prompt text, completion tokens) in replay order, and the document blocks' token counts."""
    rows = [json.loads(line) for line in (data / "paired_rag_vs_lc.jsonl").open(encoding="utf-8") if line.strip()]
    files = {p.stem: p for p in (data / "LEval-data").glob("*/*.jsonl")}
    sources: dict[str, list[dict]] = {}
    settings = LongContextSettings()
    budget = WINDOW - settings.answer_reserve_tokens
    for row in rows:
        task = row["task"]
        if task not in sources:
            sources[task] = [json.loads(x) for x in files[task].open(encoding="utf-8") if x.strip()]
        doc = Document(f"{task}-{int(row['doc']):03d}", sources[task][int(row["doc"])]["input"])
        packed = pack_long_context(row["query"], [doc], settings, budget)
        yield doc.id, packed, count_tokens(str(row.get("lc_pred") or ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/leval"))
    args = parser.parse_args()
    book = PriceBook()
    models = {
        "openai": book.price(ModelConfig(model="openai/gpt-4.1")),
        "anthropic": book.price(ModelConfig(model="anthropic/claude-sonnet-4-5")),
    }
    started = time.perf_counter()
    block_tokens: dict[str, int] = {}
    blocks: dict[str, str] = {}
    seen: dict[str, int] = defaultdict(int)
    cold = {name: 0.0 for name in models}
    warm = {name: 0.0 for name in models}
    prompt_total = completion_total = cached_openai = cached_anthropic = questions = unfitted = 0
    for doc_id, packed, completion in prompts(args.data):
        questions += 1
        unfitted += not packed.all_fitted
        prefix, _ = split_question(packed.text)
        if doc_id not in block_tokens or blocks[doc_id] != prefix:
            blocks[doc_id], block_tokens[doc_id] = prefix, count_tokens(prefix)
            seen[doc_id] = 0
        prompt, block = packed.tokens, block_tokens[doc_id]
        prompt_total += prompt
        completion_total += completion
        for name, price in models.items():
            cold[name] += price.cost(prompt, completion)
        # OpenAI: from the second question on, the shared prefix (the document block) in 128-token steps
        cached = (block // OPENAI_STEP) * OPENAI_STEP if seen[doc_id] and block >= OPENAI_MIN_PREFIX else 0
        cached_openai += cached
        warm["openai"] += models["openai"].cost(prompt, completion, cached)
        # Anthropic: the marked block is written by the first question, read by the next ones
        if seen[doc_id]:
            cached_anthropic += block
            warm["anthropic"] += models["anthropic"].cost(prompt, completion, block, 0)
        else:
            warm["anthropic"] += models["anthropic"].cost(prompt, completion, 0, block)
        seen[doc_id] += 1
    elapsed = time.perf_counter() - started
    print(
        f"replay: {questions} questions on {len(block_tokens)} documents ({questions / len(block_tokens):.1f} a "
        f"document), {prompt_total:,} prompt + {completion_total:,} completion tokens; {unfitted} prompts without "
        f"every unit; {elapsed:.0f} s"
    )
    for name, model, cached in (
        ("openai", "gpt-4.1", cached_openai),
        ("anthropic", "claude-sonnet-4-5", cached_anthropic),
    ):
        price = models[name]
        rates = (
            f"input ${price.input_per_token * 1e6:.2f}/M, cache read ${price.cache_read_per_token * 1e6:.2f}/M"
            + (f", cache write ${price.cache_write_per_token * 1e6:.2f}/M" if price.cache_write_per_token else "")
            + f", output ${price.output_per_token * 1e6:.2f}/M"
        )
        saving = cold[name] - warm[name]
        print(f"{name:9s} {model:18s} {rates}")
        print(
            f"{'':9s} long route without caching ${cold[name]:.2f}, with caching ${warm[name]:.2f}: "
            f"saves ${saving:.2f} ({100 * saving / cold[name]:.1f}%); cached prompt tokens {cached:,} "
            f"({100 * cached / prompt_total:.1f}% of prompt tokens)"
        )


if __name__ == "__main__":
    main()
