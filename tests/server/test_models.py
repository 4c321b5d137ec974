"""GET /v1/models and /v1/models/{id} through the official openai client."""

from __future__ import annotations

import openai
import pytest

from tests.support.gateway import running_gateway
from tests.support.policies import make_policy


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("models"), make_policy(upstream[0])) as (url, app):
        yield url, app


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize(
    ("model_id", "owner"),
    [("selfroute", "selfroute"), ("openai/fake-long", "openai"), ("local/all-minilm-l6-v2", "local")],
)
def test_retrieve_each_listed_model(gateway, model_id, owner):
    url, _ = gateway
    assert model_id in [m.id for m in client(url).models.list()]
    model = client(url).models.retrieve(model_id)  # the client sends 'openai%2Ffake-long'
    assert (model.id, model.object, model.owned_by) == (model_id, "model", owner)


def test_unknown_model_is_openai_404(gateway):
    url, _ = gateway
    with pytest.raises(openai.NotFoundError) as caught:
        client(url).models.retrieve("gpt-nonexistent")
    error = caught.value.body
    assert caught.value.status_code == 404
    assert error["code"] == "model_not_found" and error["param"] == "model" and "gpt-nonexistent" in error["message"]
