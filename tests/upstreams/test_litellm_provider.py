"""Providers that go through litellm (here litellm's custom_openai provider against the fake upstream):
answers, streams, usage and error mapping through a real gateway."""

from __future__ import annotations

import openai
import pytest

from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import Whole, make_policy, model_route


def policy(base: str):
    """Both routes through litellm's custom_openai provider, keyed from $FAKE_UPSTREAM_KEY."""
    keyed = {"api_base": f"{base}/v1", "api_key_env": "FAKE_UPSTREAM_KEY"}
    return make_policy(
        base,
        name="litellm-test",
        cheap=model_route("custom_openai/fake-cheap", **keyed, input_cost_per_mtok=1.0, output_cost_per_mtok=2.0),
        long=model_route("custom_openai/status-429", **keyed, timeout=5),
        routing=Whole(classifier=None),
        passthrough={"allow": ["custom_openai/*"]},
    )


@pytest.fixture()
def gateway(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-from-env")
    with running_gateway(tmp_path, policy(upstream[0])) as (url, app):
        yield url, app


def test_litellm_provider_answers_streams_and_is_priced(gateway, upstream):
    url, app = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    answer = client.chat.completions.create(
        model="custom_openai/fake-cheap", messages=[{"role": "user", "content": "hello there"}]
    )
    assert answer.choices[0].message.content == "echo: hello there"
    assert upstream[1].state.received[-1]["headers"]["authorization"] == "Bearer sk-from-env"
    chunks = list(
        client.chat.completions.create(
            model="custom_openai/fake-cheap",
            messages=[{"role": "user", "content": "one two"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == "echo: one two"
    plain, streamed = ledger_rows(app)
    assert (plain["prompt_tokens"], plain["completion_tokens"]) == (2, 3)
    assert plain["cost_usd"] == pytest.approx(2 * 1e-6 + 3 * 2e-6)
    assert streamed["stream"] == 1 and streamed["completion_tokens"] > 0


def test_litellm_provider_errors_keep_their_status(gateway):
    url, app = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="custom_openai/status-429", messages=[{"role": "user", "content": "x"}])
    assert caught.value.response.json()["error"]["code"] == "upstream_rate_limited"
    assert ledger_rows(app)[0]["status"] == 429


@pytest.mark.parametrize("model", ["shape-list", "shape-string", "shape-no-choices", "shape-bad-usage"])
def test_litellm_answers_of_the_wrong_shape_are_502s_with_their_leg(gateway, model):
    url, app = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model=f"custom_openai/{model}", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    [row] = ledger_rows(app)
    [call] = ledger_rows(app, "upstream_calls")
    assert row["status"] == 502 and call["model"] == f"custom_openai/{model}" and call["error"]


@pytest.mark.parametrize("model", ["json-stream", "text-stream", "empty-stream"])
def test_litellm_stream_answered_without_events_is_a_502(gateway, model):
    url, app = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        list(
            client.chat.completions.create(
                model=f"custom_openai/{model}", stream=True, messages=[{"role": "user", "content": "x"}]
            )
        )
    assert caught.value.status_code == 502
    [row] = ledger_rows(app)
    assert row["status"] == 502 and ledger_rows(app, "upstream_calls")[0]["error"]


@pytest.mark.parametrize("model", ["text-stream"])  # (a JSON completion, litellm streams whole)
def test_a_provider_whose_stream_litellm_empties_is_a_502_not_an_empty_answer(upstream, tmp_path, monkeypatch, model):
    """probe11: through litellm's deepseek provider, a stream request answered with JSON or plain text came back as an
    empty 200 (finish_reason "stop", $0); the direct path and custom_openai say 502."""
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-from-env")
    keyed = {"api_base": f"{upstream[0]}/v1", "api_key_env": "FAKE_UPSTREAM_KEY"}
    hosted = make_policy(
        upstream[0],
        name="litellm-deepseek",
        cheap=model_route(f"deepseek/{model}", **keyed),
        long=model_route("deepseek/fake-long", **keyed),
        routing=Whole(classifier=None),
        passthrough={"allow": ["deepseek/*"]},
    )
    with running_gateway(tmp_path, hosted) as (url, app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        texts = []
        with pytest.raises(openai.APIError):
            for chunk in client.chat.completions.create(
                model=f"deepseek/{model}", stream=True, messages=[{"role": "user", "content": "x"}]
            ):
                texts.append(chunk.choices[0].delta.content if chunk.choices else None)
        [row] = ledger_rows(app)
    assert row["status"] == 502 and not any(texts)
