"""What the app factory wires: the /chat/completions alias for clients configured without /v1."""

from __future__ import annotations

import openai
import pytest

from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("app"), make_policy(upstream[0])) as (url, app):
        yield url, app


def test_chat_completions_without_v1(gateway):
    url, app = gateway
    no_v1 = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    response = no_v1.chat.completions.with_raw_response.create(
        model="selfroute", messages=[{"role": "user", "content": "Say hello."}]
    )
    assert response.http_request.url.path == "/chat/completions"
    assert response.headers["x-selfroute-route"] and response.parse().choices[0].message.content.startswith("echo:")
    assert ledger_rows(app)[-1]["status"] == 200
