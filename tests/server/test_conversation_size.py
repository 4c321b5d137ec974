"""A conversation with a pasted document (no selfroute.documents: the plain OpenAI-client case), through a real
gateway: the rag route indexes at most rag.max_attached_tokens of it, as of attached documents; over the cap the
request is a 413 documents_too_large before anything is split or embedded, while the direct and long routes, which
pack the conversation instead of indexing it, still answer."""

from __future__ import annotations

import openai
import pytest

from pipelines.embedding import Embedder
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy

CAP = 2000  # rag.max_attached_tokens in this test's policy
PASTED = " ".join(f"Section {i}: the pump housing number {i} is inspected every {i % 7 + 2} weeks." for i in range(300))


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


def conversation(text: str) -> list[dict]:
    return [{"role": "user", "content": f"{text}\n\nHow often is pump housing 41 inspected?"}]


def ask(url: str, text: str, route: str | None = None):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    extra = {"selfroute": {"route": route}} if route else None
    return client.chat.completions.create(model="selfroute", messages=conversation(text), extra_body=extra)


def test_the_rag_route_refuses_to_index_a_conversation_over_the_cap(upstream, tmp_path, embedder):
    base, fake = upstream
    policy = make_policy(base, rag={"max_attached_tokens": CAP}, routing={"default_route": "rag"})
    with running_gateway(tmp_path, policy, embedder=embedder) as (url, app):
        calls = len(fake.state.received)
        for route in (None, "rag"):  # routed to rag by the policy, or asked for
            with pytest.raises(openai.APIStatusError) as refused:
                ask(url, PASTED, route)
            error = refused.value
            assert error.status_code == 413 and error.code == "documents_too_large", error.body
            assert "conversation" in error.message and "rag.max_attached_tokens" in error.message
            assert "selfroute.collection" in error.message and error.param == "messages"
        assert len(fake.state.received) == calls  # no model was called
        assert not list(tmp_path.rglob("*.lance"))  # nothing indexed
        # the direct and long routes pack the conversation: no cap on it there
        assert ask(url, PASTED, "long").choices[0].message.content
        assert ask(url, PASTED, "direct").choices[0].message.content
        # under the cap the rag route indexes it as before
        assert ask(url, PASTED[: len(PASTED) // 4], "rag").choices[0].message.content
        app.state.gateway.store.wait_inline()
        assert list(tmp_path.rglob("*.lance"))  # (the check above can see an index)
        statuses = [row["status"] for row in ledger_rows(app)]
        assert statuses.count(413) == 2, statuses  # the refusals are ledgered too
