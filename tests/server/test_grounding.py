"""The grounding check on a real gateway: an upstream that answers one supported and one invented sentence;
`flag` reports per-sentence scores and a header, `drop` removes the invented sentence, `off` checks nothing."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import DROP, fake_route, make_policy
from tests.support.servers import serve_app

CONTRACT = (
    "The supplier shall deliver the pumps within 30 days of the order. The laws of Norway govern this "
    "contract. Disputes go to the courts of Oslo."
)
SUPPORTED = "The laws of Norway govern this contract."
INVENTED = "The supplier was founded in 1887 by Captain Nemo, who built its first factory on the Moon."


def policy(base: str, grounding: str):
    """Both routes on the fixed answer; the grounding check as `grounding` says."""
    return make_policy(
        base,
        name="grounding",
        cheap=fake_route(base, "fixed"),
        long=fake_route(base, "fixed", context_window=16000),
        security={"grounding": grounding},
        passthrough=DROP,
    )


async def fixed_answer(request: Request):
    await request.json()
    return JSONResponse(
        {
            "id": "x",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "fixed",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"{SUPPORTED} {INVENTED}"},
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
        }
    )


@pytest.fixture(scope="module")
def model():
    with serve_app(Starlette(routes=[Route("/v1/chat/completions", fixed_answer, methods=["POST"])])) as url:
        yield url


def _ask(url: str, route: str = "long") -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        timeout=120,
        json={
            "model": "selfroute",
            "messages": [{"role": "user", "content": "Which law governs the contract?"}],
            "selfroute": {"route": route, "documents": [{"id": "contract", "text": CONTRACT}]},
        },
    )


@pytest.mark.parametrize("mode", ["flag", "drop"])
def test_unsupported_sentences_are_reported_or_dropped(model, tmp_path, mode):
    with running_gateway(tmp_path, policy(model, mode)) as (url, _):
        for route in ("long", "rag"):
            response = _ask(url, route)
            assert response.status_code == 200, response.text
            report = response.json()["selfroute"]["grounding"]
            scores = {s["text"]: s for s in report["sentences"]}
            assert scores[SUPPORTED]["supported"] and not scores[INVENTED]["supported"]
            assert scores[SUPPORTED]["score"] > scores[INVENTED]["score"]
            assert response.headers["x-selfroute-grounding"] == "unsupported=1/2"
            content = response.json()["choices"][0]["message"]["content"]
            assert content == (SUPPORTED if mode == "drop" else f"{SUPPORTED} {INVENTED}")


def test_off_leaves_answers_unchecked(model, tmp_path):
    with running_gateway(tmp_path, policy(model, "off")) as (url, _):
        response = _ask(url)
        assert "grounding" not in response.json()["selfroute"] and "x-selfroute-grounding" not in response.headers


def stream_policy(base: str, grounding: str):
    """Both routes on the fake upstream's scripted answer; the grounding check as `grounding` says."""
    return make_policy(
        base,
        name="grounding-stream",
        cheap=fake_route(base, "cheap-scripted"),
        long=fake_route(base, "long-scripted", context_window=16000),
        security={"grounding": grounding},
        passthrough=DROP,
    )


@pytest.mark.parametrize("mode", ["flag", "drop"])
def test_streamed_answers_are_checked_after_the_stream(upstream, tmp_path, mode):
    """The official client streaming from a real gateway (fake upstream): the answer comes as it was written, then a
    trailing chunk carries `selfroute.grounding` before the usage chunk and [DONE]; the ledger keeps the counts, as it
    does for a whole answer."""
    upstream[1].state.scripted = f"{SUPPORTED} {INVENTED}"
    with running_gateway(tmp_path, stream_policy(upstream[0], mode)) as (url, app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for route in ("long", "rag"):
            chunks = list(
                client.chat.completions.create(
                    model="selfroute",
                    messages=[{"role": "user", "content": "Which law governs the contract?"}],
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"selfroute": {"route": route, "documents": [{"id": "contract", "text": CONTRACT}]}},
                )
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text.split() == f"{SUPPORTED} {INVENTED}".split()  # sent as it came: nothing dropped
            [checked] = [c for c in chunks if (c.model_extra or {}).get("selfroute", {}).get("grounding")]
            report = checked.model_extra["selfroute"]["grounding"]
            scores = {s["text"]: s for s in report["sentences"]}
            assert scores[SUPPORTED]["supported"] and not scores[INVENTED]["supported"]
            assert ("would_drop" in report) == (mode == "drop")
            order = chunks.index(checked)
            assert chunks[order - 1].choices[0].finish_reason == "stop"  # after the answer
            assert chunks[-1].usage is not None and order == len(chunks) - 2  # before the usage chunk
        whole = _ask(url)  # the whole answer's check records the same counts
        assert whole.status_code == 200
        rows = ledger_rows(app)
        assert [json.loads(r["provenance"])["grounding"] for r in rows] == [{"checked": 2, "unsupported": 1}] * 3
        assert [r["stream"] for r in rows] == [1, 1, 0]


def test_streams_are_unchecked_when_the_check_is_off(upstream, tmp_path):
    upstream[1].state.scripted = f"{SUPPORTED} {INVENTED}"
    with running_gateway(tmp_path, stream_policy(upstream[0], "off")) as (url, app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="selfroute",
                messages=[{"role": "user", "content": "Which law governs the contract?"}],
                stream=True,
                extra_body={"selfroute": {"route": "long", "documents": [{"text": CONTRACT}]}},
            )
        )
        assert chunks and not any((c.model_extra or {}).get("selfroute") for c in chunks)
        [row] = ledger_rows(app)
        assert "grounding" not in json.loads(row["provenance"])
