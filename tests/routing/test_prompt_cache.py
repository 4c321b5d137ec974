"""Provider prompt caching on the long route: documents first and the question last, the document block marked
cacheable for Anthropic-style upstreams, cached prompt tokens ledgered and priced at the cache rates, and shown by
`selfroute costs`. The fake upstream reports cached usage as OpenAI and Anthropic (through litellm) do."""

from __future__ import annotations

import json

import httpx  # noqa: F401  (imported whole before the gateway's litellm warm-up thread imports it: openai checks it)
import openai
import pytest

from gateway.cli import main
from gateway.ledger import reports
from gateway.ledger.summary import summary
from gateway.routing.prompt_cache import EPHEMERAL, mark_document_block, needs_cache_control, stable_document_block
from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.embedding import Embedder
from pipelines.long_context import split_question
from policies.schema import ModelConfig
from tests.support.gateway import ledger_rows
from tests.support.policies import prompt_cache_policy
from tests.support.servers import serve_app

DOCS = [{"id": "b-notes", "text": "Valves close clockwise. " * 40}, {"id": "a-manual", "text": "Pumps hum. " * 60}]


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture
def start(upstream, embedder, tmp_path):
    servers = []

    def _start(long_model: str, cache_control: bool | None):
        policy = prompt_cache_policy(upstream[0], name="cache-test", long=long_model, cache_control=cache_control)
        app = create_app(Settings(data_dir=tmp_path), policy=policy, embedder=embedder)
        server = serve_app(app)
        servers.append(server)
        return server.__enter__(), app

    yield _start
    for server in servers:
        server.__exit__(None, None, None)


def ask(url: str, question: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="selfroute",
        messages=[{"role": "user", "content": question}],
        extra_body={"selfroute": {"documents": DOCS}},
    )


def test_claude_models_get_cache_control_unless_the_policy_says_otherwise():
    assert needs_cache_control(ModelConfig(model="anthropic/claude-sonnet-4-5"))
    assert needs_cache_control(ModelConfig(model="bedrock/anthropic.claude-3-5-sonnet-20241022-v2:0"))
    assert not needs_cache_control(ModelConfig(model="openai/gpt-4.1"))  # OpenAI caches prefixes by itself
    assert not needs_cache_control(ModelConfig(model="anthropic/claude-sonnet-4-5", cache_control=False))
    assert needs_cache_control(ModelConfig(model="openai/my-proxy", cache_control=True))


def test_only_a_block_that_comes_back_unchanged_is_marked():
    whole = {"route": "long", "all_fitted": True, "placement": "reading"}
    assert stable_document_block(whole)
    assert not stable_document_block({**whole, "all_fitted": False})  # units chosen per question
    assert not stable_document_block({**whole, "placement": "edges"})  # units ordered by relevance to the question
    assert not stable_document_block({**whole, "route": "rag"})


def test_the_document_block_becomes_a_cacheable_part_and_the_question_stays_last():
    text = "Answer using the documents.\n\n[Document: a]\nalpha\n\nQuestion: what is alpha?"
    history = [{"role": "system", "content": "be brief"}]
    marked = mark_document_block([*history, {"role": "user", "content": text}])
    assert marked[0] == history[0]
    docs, question = marked[-1]["content"]
    assert docs == {
        "type": "text",
        "text": "Answer using the documents.\n\n[Document: a]\nalpha",
        "cache_control": EPHEMERAL,
    }
    assert question == {"type": "text", "text": "\n\nQuestion: what is alpha?"}
    assert docs["text"] + question["text"] == text
    assert split_question("no question here") == ("no question here", "")


def test_anthropic_style_cache_is_marked_ledgered_and_priced(start, upstream, tmp_path, capsys):
    url, app = start("fake-long", cache_control=True)
    ask(url, "Which way do valves close?")
    ask(url, "Do pumps hum?")
    first, second = [r["body"] for r in upstream[1].state.received[-2:]]
    for body, question in ((first, "Which way do valves close?"), (second, "Do pumps hum?")):
        docs, last = body["messages"][-1]["content"]
        assert docs["cache_control"] == EPHEMERAL and last["text"].endswith(question)
    # same documents, other question: the cacheable block is byte for byte the same, documents in a stable order
    assert first["messages"][-1]["content"][0] == second["messages"][-1]["content"][0]
    block = first["messages"][-1]["content"][0]["text"]
    assert block.index("b-notes") < block.index("a-manual")  # attached documents keep the order they were given
    rows = ledger_rows(app)
    calls = ledger_rows(app, "upstream_calls")
    assert [r["route"] for r in rows] == ["long", "long"]
    words = len(block.split())
    write, read = calls
    assert write["cached_tokens"] == 0 and read["cached_tokens"] == words
    # the write costs 12.5/M instead of 10/M on the block; the read 1/M instead of 10/M
    assert write["cache_saving_usd"] == pytest.approx(-words * 2.5e-6)
    assert read["cache_saving_usd"] == pytest.approx(words * 9e-6)
    plain_cost = read["prompt_tokens"] * 10e-6 + read["completion_tokens"] * 20e-6
    assert read["cost_usd"] == pytest.approx(plain_cost - words * 9e-6)
    assert rows[1]["cached_tokens"] == words and rows[1]["cache_saving_usd"] == pytest.approx(words * 9e-6)

    app.state.gateway.ledger.flush()
    assert main(["costs", "--data-dir", str(tmp_path), "--by", "route", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [long_row] = report["groups"]
    assert (long_row["cache_hits"], long_row["cached_tokens"]) == (1, words)
    assert long_row["cache_saving_usd"] == pytest.approx(words * 9e-6 - words * 2.5e-6)
    assert main(["costs", "--data-dir", str(tmp_path), "--by", "route"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-6:] == ["cache", "hits", "cached", "tok", "cache", "saved"]
    assert lines[1].split()[-3:] == ["1", f"{words:,}", f"${words * 6.5e-6:,.4f}"]
    # the dashboard's cache panel: of the long route's two calls one read the cache, the write counts against it
    conn = reports.connect_reader(app.state.gateway.ledger.location)
    try:
        panel = summary(conn, window=3600)["prompt_cache"]
    finally:
        conn.close()
    prompts = sum(c["prompt_tokens"] for c in calls)
    assert panel["routes"] == [
        {
            "group": "long",
            "calls": 2,
            "cache_hits": 1,
            "hit_rate": 0.5,
            "prompt_tokens": prompts,
            "cached_tokens": words,
            "cached_share": pytest.approx(words / prompts),
            "cache_saving_usd": pytest.approx(words * 6.5e-6),
        }
    ]


def test_openai_style_prefix_cache_needs_no_marking_and_is_ledgered(start, upstream):
    url, app = start("fake-long-prefix-cache", cache_control=None)
    ask(url, "Which way do valves close?")
    ask(url, "Do pumps hum?")
    first, second = [r["body"]["messages"][-1]["content"] for r in upstream[1].state.received[-2:]]
    assert isinstance(first, str) and isinstance(second, str)  # plain text: the provider finds the prefix itself
    shared = len(split_question(first)[0].split()) + 1  # the documents and the "Question:" lead
    assert split_question(first)[0] == split_question(second)[0]
    calls = ledger_rows(app, "upstream_calls")
    assert [c["cached_tokens"] for c in calls] == [0, shared]
    assert calls[1]["cache_saving_usd"] == pytest.approx(shared * 9e-6)
