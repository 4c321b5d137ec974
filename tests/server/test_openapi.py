"""GET /openapi.json describes every route of the real app, with bodies from the pydantic models."""

from __future__ import annotations

import re

import httpx
import pytest
from starlette.schemas import SchemaGenerator

from gateway.protocol import ChatCompletionRequest
from gateway.server.auth import Authenticator
from gateway.server.embeddings import EmbeddingsRequest
from tests.support.gateway import running_gateway
from tests.support.policies import make_policy

ADMIN = "sk-admin-openapi"


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    with running_gateway(
        tmp_path_factory.mktemp("openapi"), make_policy(upstream[0]), auth=Authenticator(admin_key=ADMIN)
    ) as (url, app):
        yield url, app


def _resolve(schema: dict, ref: str) -> dict:
    assert ref.startswith("#/components/schemas/")
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_every_route_is_described(gateway):
    url, app = gateway
    schema = httpx.get(f"{url}/openapi.json").json()
    operations = [op for ops in schema["paths"].values() for op in ops.values()]
    assert len({op["operationId"] for op in operations}) == len(operations)  # unique, aliases included
    # each handler its own summary (two paths to one handler share it), and a described success answer
    by_handler = {
        op["operationId"].split("_get")[0].split("_post")[0].split("_delete")[0]: op["summary"] for op in operations
    }
    assert len(set(by_handler.values())) == len(by_handler)
    for op in operations:
        success = op["responses"].get("200") or op["responses"]["201"]
        assert success["content"], op["operationId"]
    assert schema["openapi"].startswith("3.1") and schema["info"]["title"] == "selfroute"
    served = {(e.path, e.http_method) for e in SchemaGenerator({}).get_endpoints(app.routes)}
    described = {(path, method) for path, ops in schema["paths"].items() for method in ops}
    assert served == described and len(served) >= 20
    for needed in [
        ("/v1/models/{model_id}", "get"),
        ("/v1/embeddings", "post"),
        ("/chat/completions", "post"),
        ("/health/readiness", "get"),
        ("/v1/collections/{name}", "delete"),
        ("/openapi.json", "get"),
    ]:
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


def _validator(schema: dict, ref: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator({"$ref": ref, "components": schema["components"]})


def test_real_answers_match_their_declared_schemas(gateway):
    """The response schemas are what the endpoints answer: each one checked against a real answer."""
    url, app = gateway
    admin = {"Authorization": f"Bearer {ADMIN}"}
    schema = httpx.get(f"{url}/openapi.json").json()
    chat = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "Which pump is first?"}],
        "selfroute": {"documents": [{"id": "m", "text": "Start pump P1 before P2. " * 20}]},
    }
    httpx.post(
        f"{url}/v1/collections/manual/documents",
        headers=admin,
        json={"documents": [{"id": "a", "text": "Section 1. Open valve V2 first."}]},
        timeout=120,
    )
    request_id = httpx.post(f"{url}/v1/chat/completions", headers=admin, json=chat, timeout=120).headers[
        "x-selfroute-request-id"
    ]
    app.state.gateway.ledger.flush()
    calls = [
        ("get", "/healthz", None),
        ("get", "/health/readiness", None),
        ("get", "/v1/models", None),
        ("get", "/v1/models/{model_id}", {"model_id": "selfroute"}),
        ("post", "/v1/chat/completions", chat),
        ("post", "/v1/route/explain", chat),
        ("get", "/v1/collections", None),
        ("get", "/v1/collections/{name}", {"name": "manual"}),
        ("post", "/v1/collections/{name}/documents", {"name": "manual", "documents": [{"id": "b", "text": "More."}]}),
        ("delete", "/v1/collections/{name}/documents/{doc_id}", {"name": "manual", "doc_id": "b"}),
        ("post", "/v1/feedback", {"request_id": request_id, "good": True}),
        ("get", "/v1/admin/requests", None),
        ("get", "/v1/admin/requests/{request_id}", {"request_id": request_id}),
        ("get", "/v1/admin/costs", None),
        ("get", "/v1/admin/summary", None),
        ("get", "/v1/admin/reload", None),
        ("post", "/v1/admin/keys", {"name": "openapi-team"}),
        ("get", "/v1/admin/keys", None),
        ("patch", "/v1/admin/keys/{name}", {"name": "openapi-team", "rpm": 600}),
        ("post", "/v1/admin/keys/{name}/rotate", {"name": "openapi-team"}),
        ("delete", "/v1/admin/keys/{name}", {"name": "openapi-team"}),
        ("delete", "/v1/collections/{name}", {"name": "manual"}),
        ("get", "/openapi.json", None),
    ]
    for method, path, payload in calls:
        params = {k: v for k, v in (payload or {}).items() if "{" + k + "}" in path}
        body = {k: v for k, v in (payload or {}).items() if k not in params} if method in ("post", "patch") else None
        response = httpx.request(method, url + path.format(**params), headers=admin, json=body, timeout=120)
        assert response.status_code in (200, 201), (path, response.text)
        declared = schema["paths"][path][method]["responses"][str(response.status_code)]
        ref = declared["content"]["application/json"]["schema"]["$ref"]
        errors = [e.message for e in _validator(schema, ref).iter_errors(response.json())]
        assert errors == [], (path, errors[:3])
    error = httpx.get(f"{url}/v1/models/nope", headers=admin)
    assert error.status_code == 404 and not list(
        _validator(schema, "#/components/schemas/ErrorEnvelope").iter_errors(error.json())
    )


def test_docs_serve_swagger_ui_from_the_package(gateway):
    url, _ = gateway
    page = httpx.get(f"{url}/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in page.text and "SwaggerUIBundle" in page.text
    assert "http://" not in page.text and "https://" not in page.text and "//cdn" not in page.text  # nothing remote
    for asset in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        served = httpx.get(url + asset)
        assert served.status_code == 200 and len(served.content) > 10_000, asset
    assert "SwaggerUIBundle" in httpx.get(f"{url}/docs/assets/swagger-ui-bundle.js").text
