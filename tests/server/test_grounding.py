"""The grounding check on a real gateway: an upstream that answers one supported and one invented sentence;
`flag` reports per-sentence scores and a header, `drop` removes the invented sentence, `off` checks nothing."""

from __future__ import annotations

import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.gateway import running_gateway
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
