"""POST /v1/embeddings through the official openai client: the gateway's own MiniLM in-process, other names
passed to the OpenAI-compatible upstream, both in the ledger."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from pipelines.embedding import Embedder
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture(scope="module")
def gateway(upstream, embedder, tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    try:
        with running_gateway(tmp_path_factory.mktemp("emb"), make_policy(upstream[0]), embedder=embedder) as (url, app):
            yield url, app
    finally:
        patch.undo()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_local_model_matches_the_embedder_in_float_and_base64(gateway, embedder):
    url, app = gateway
    from tokenizers import Tokenizer

    from pipelines.embedding import default_model_path

    word_pieces = Tokenizer.from_file(f"{default_model_path()}/tokenizer.json")
    word_pieces.no_padding()  # the file pads every text to its length limit
    texts = ["Open valve V2 before starting the pump.", "The harbour office opens at nine."]
    expected = embedder.embed(texts)
    as_base64 = client(url).embeddings.create(model="local/all-minilm-l6-v2", input=texts)  # the client's default
    as_floats = client(url).embeddings.create(model="local/all-minilm-l6-v2", input=texts, encoding_format="float")
    for answer in (as_base64, as_floats):
        assert answer.model == "local/all-minilm-l6-v2" and [d.index for d in answer.data] == [0, 1]
        got = np.array([d.embedding for d in answer.data], dtype=np.float32)
        assert got.shape == (2, 384) and np.allclose(got, expected, atol=1e-5)
        tokens = sum(len(word_pieces.encode(t).ids) for t in texts)  # the model's own tokenizer, special tokens in
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    row = [r for r in ledger_rows(app) if r["alias"] == "local/all-minilm-l6-v2"][-1]
    assert row["status"] == 200 and row["route"] == "passthrough" and row["prompt_tokens"] == tokens


def test_other_models_pass_through_to_the_upstream(gateway, upstream):
    url, app = gateway
    answer = client(url).embeddings.create(model="text-embedding-3-small", input="two words", encoding_format="float")
    assert answer.data[0].embedding == [9.0, 2.0, 1.0] and answer.usage.prompt_tokens == 2
    sent = upstream[1].state.received[-1]["body"]
    assert sent["model"] == "text-embedding-3-small" and sent["input"] == "two words"
    row = [r for r in ledger_rows(app) if r["alias"] == "text-embedding-3-small"][-1]
    assert row["status"] == 200 and row["prompt_tokens"] == 2
    # the gateway's own extension stays here, as chat's does; a provider's own fields go as sent (probe11)
    client(url).embeddings.create(
        model="text-embedding-3-small",
        input="two words",
        extra_body={"selfroute": {"documents": [{"id": "d", "text": "secret"}]}, "input_type": "query"},
    )
    sent = upstream[1].state.received[-1]["body"]
    assert "selfroute" not in sent and sent["input_type"] == "query"


def test_upstream_errors_keep_their_status(gateway):
    url, app = gateway
    with pytest.raises(openai.RateLimitError):
        client(url).embeddings.create(model="status-429", input="x")
    assert [r for r in ledger_rows(app) if r["alias"] == "status-429"][-1]["status"] == 429


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "local/all-minilm-l6-v2"}, "input", "invalid_value"),
        ({"model": "local/all-minilm-l6-v2", "input": []}, "input", "invalid_value"),
        ({"model": "local/all-minilm-l6-v2", "input": [[1, 2, 3]]}, "input", "unsupported_parameter"),
        ({"model": "local/all-minilm-l6-v2", "input": "x", "dimensions": 64}, "dimensions", "unsupported_parameter"),
        (
            {"model": "local/all-minilm-l6-v2", "input": "x", "encoding_format": "hex"},
            "encoding_format",
            "invalid_value",
        ),
        ({"model": "anthropic/claude-3-5-sonnet", "input": "x"}, "model", "model_not_found"),
        ({"model": "http://evil.example/v1", "input": "x"}, "model", "invalid_value"),
        (
            {"model": "text-embedding-3-small", "input": "x", "api_base": "http://evil.example"},
            "api_base",
            "unsupported_parameter",
        ),
    ],
)
def test_bad_requests_are_openai_400s(gateway, body, param, code):
    url, _ = gateway
    response = httpx.post(f"{url}/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)


def test_a_refused_key_is_counted_once_and_not_ledgered(upstream, embedder, tmp_path):
    from gateway.server.auth import Authenticator

    with running_gateway(tmp_path, make_policy(upstream[0]), embedder=embedder, auth=Authenticator(["sk-good"])) as (
        url,
        app,
    ):
        before = app.state.gateway.metrics.unauthenticated._value.get()
        bad = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-bad", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.embeddings.create(model="local/all-minilm-l6-v2", input="x")
        assert app.state.gateway.metrics.unauthenticated._value.get() == before + 1
        assert ledger_rows(app) == []
