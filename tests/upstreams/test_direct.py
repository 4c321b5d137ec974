"""The direct OpenAI-compatible path: malformed answers are 502s with their leg ledgered, retries back off
with jitter and honour Retry-After — through the official openai client, a real gateway and the fake upstream."""
from __future__ import annotations

import email.utils
import time

import openai
import pytest
from tenacity import RetryCallState

from gateway.errors import GatewayError
from gateway.upstreams.direct import MAX_RETRY_AFTER_S, _Retryable, _wait, retry_after_seconds
from tests.gateway_fixtures import ledger_rows, make_policy, running_gateway


@pytest.fixture()
def gateway(upstream, tmp_path, monkeypatch):
    base, _ = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    with running_gateway(tmp_path, make_policy(base)) as (url, app):
        yield url, app


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def assert_502_with_leg(app, model: str) -> None:
    [row] = ledger_rows(app)
    [call] = ledger_rows(app, "upstream_calls")
    assert row["status"] == 502 and row["error"]
    assert call["model"] == model and "malformed" in call["error"]


@pytest.mark.parametrize("model", ["json-stream", "text-stream", "empty-stream"])
def test_a_stream_request_answered_without_events_is_a_502_not_an_empty_200(gateway, model):
    url, app = gateway
    with pytest.raises(openai.APIStatusError) as caught:
        list(client(url).chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], stream=True))
    assert caught.value.status_code == 502
    assert caught.value.response.json()["error"]["code"] == "upstream_error"
    assert_502_with_leg(app, model)


@pytest.mark.parametrize("model", ["shape-list", "shape-string", "shape-no-choices", "shape-bad-usage"])
def test_an_answer_of_the_wrong_shape_is_a_502_with_its_leg_ledgered(gateway, model):
    url, app = gateway
    with pytest.raises(openai.APIStatusError) as caught:
        client(url).chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    assert "malformed" in caught.value.response.json()["error"]["message"]
    assert_502_with_leg(app, model)


def test_retry_after_is_honoured(upstream, tmp_path):
    base, fake = upstream
    policy = make_policy(base, """
name: t
cheap: {{model: openai/wait-1, api_base: "{base}/v1", max_retries: 2}}
long: {{model: openai/fake-long, api_base: "{base}/v1"}}
routing: {{classifier: null}}
""")
    with running_gateway(tmp_path, policy) as (url, app):
        before = len(fake.state.received)
        answer = client(url).chat.completions.create(model="openai/wait-1", messages=[{"role": "user", "content": "x"}])
        assert answer.choices[0].message.content == "echo: x"
        first, second = fake.state.received[before:]
        assert second["at"] - first["at"] >= 1.0  # the 429 said "Retry-After: 1"
        [row] = ledger_rows(app)
        assert row["status"] == 200


def test_a_retry_after_beyond_the_cap_is_not_waited_for(upstream, tmp_path):
    base, fake = upstream
    policy = make_policy(base, f"""
name: t
cheap: {{{{model: openai/wait-{int(MAX_RETRY_AFTER_S) + 60}, api_base: "{{base}}/v1", max_retries: 3}}}}
long: {{{{model: openai/fake-long, api_base: "{{base}}/v1"}}}}
routing: {{{{classifier: null}}}}
""")
    fake.state.wait_calls = 0
    with running_gateway(tmp_path, policy) as (url, _):
        before = len(fake.state.received)
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError):
            client(url).chat.completions.create(model=policy.cheap.model, messages=[{"role": "user", "content": "x"}])
        assert len(fake.state.received) - before == 1 and time.monotonic() - started < 5


def test_retry_after_forms():
    now = time.time()
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    date = email.utils.formatdate(now + 20, usegmt=True)
    assert 18 <= retry_after_seconds({"retry-after": date}, now=now) <= 21
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_backoff_is_jittered_and_grows_unless_the_upstream_names_a_wait():
    def waits(attempt: int, retry_after: float | None) -> set[float]:
        seen = set()
        for _ in range(50):
            state = RetryCallState(None, None, (), {})
            state.attempt_number = attempt
            state.set_exception((_Retryable, _Retryable(GatewayError(503, "x"), retry_after), None))
            seen.add(_wait(state))
        return seen

    assert waits(1, 2.5) == {2.5}
    first, fourth = waits(1, None), waits(4, None)
    assert len(first) > 10 and max(first) <= 0.5  # random, not one fixed delay
    assert max(fourth) > max(first) and max(fourth) <= 4.0
