"""GET /openapi.json describes every route of the real app, with bodies from the pydantic models."""
from __future__ import annotations

import httpx
import pytest
from starlette.schemas import SchemaGenerator

from gateway.protocol import ChatCompletionRequest
from gateway.server.embeddings import EmbeddingsRequest
from tests.gateway_fixtures import make_policy, running_gateway


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("openapi"), make_policy(upstream[0])) as (url, app):
        yield url, app


def _resolve(schema: dict, ref: str) -> dict:
    assert ref.startswith("#/components/schemas/")
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_every_route_is_described(gateway):
    url, app = gateway
    schema = httpx.get(f"{url}/openapi.json").json()
    assert schema["openapi"].startswith("3.1") and schema["info"]["title"] == "selfroute"
    served = {(e.path, e.http_method) for e in SchemaGenerator({}).get_endpoints(app.routes)}
    described = {(path, method) for path, ops in schema["paths"].items() for method in ops}
    assert served == described and len(served) >= 20
    for needed in [("/v1/models/{model_id}", "get"), ("/v1/embeddings", "post"), ("/chat/completions", "post"),
                   ("/health/readiness", "get"), ("/v1/collections/{name}", "delete"), ("/openapi.json", "get")]:
        assert needed in described
    for path, ops in schema["paths"].items():
        for op in ops.values():
            assert op["summary"] and op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"]
            assert [p["name"] for p in op.get("parameters", [])] == [s[1:-1] for s in path.split("/") if s[:1] == "{"]


def test_bodies_are_the_pydantic_schemas(gateway):
    url, _ = gateway
    schema = httpx.get(f"{url}/openapi.json").json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    request = _resolve(schema, chat["requestBody"]["content"]["application/json"]["schema"]["$ref"])
    assert set(request["properties"]) == set(ChatCompletionRequest.model_json_schema()["properties"])
    assert set(request["required"]) == {"messages", "model"}
    embeddings = schema["paths"]["/v1/embeddings"]["post"]
    request = _resolve(schema, embeddings["requestBody"]["content"]["application/json"]["schema"]["$ref"])
    assert set(request["properties"]) == set(EmbeddingsRequest.model_json_schema()["properties"])
    answer = embeddings["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert _resolve(schema, answer)["properties"]["data"]["type"] == "array"
    refs = [v for v in _walk(schema) if isinstance(v, str) and v.startswith("#/")]
    assert refs and all(_resolve(schema, ref) for ref in refs)  # every $ref points at a component
    assert schema["paths"]["/health/liveness"]["get"].get("security") is None
    assert schema["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]


def _walk(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)
    else:
        yield node
