"""GET /openapi.json: an OpenAPI 3.1 description of every route the app serves.

The paths and methods come from the app's own routes (Starlette's SchemaGenerator), so a new route appears
without anyone writing it down; request and response bodies are the JSON schemas of the pydantic models the
handlers validate with and answer from (pydantic's model_json_schema), under components/schemas."""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from gateway.server.bodies import json_response
from gateway.settings import package_version

REF = "#/components/schemas/{model}"
OPEN_PATHS = {"/healthz", "/health/liveness", "/health/readiness", "/metrics", "/openapi.json", "/dashboard"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(BaseModel):
    """Every error: OpenAI's envelope."""
    error: ErrorDetail


@dataclass(frozen=True)
class Bodies:
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None


def _bodies() -> dict[Any, Bodies]:
    """The pydantic models of each handler that has them, keyed by the handler."""
    from gateway.protocol import ChatCompletionRequest
    from gateway.server.chat import chat_completions
    from gateway.server.collections import AddDocumentsRequest, add_documents
    from gateway.server.embeddings import EmbeddingsRequest, EmbeddingsResponse, create_embeddings
    from gateway.server.explain import explain_route
    from gateway.server.models import ModelCard, ModelList, list_models, retrieve_model

    return {
        chat_completions: Bodies(ChatCompletionRequest),
        explain_route: Bodies(ChatCompletionRequest),
        add_documents: Bodies(AddDocumentsRequest),
        create_embeddings: Bodies(EmbeddingsRequest, EmbeddingsResponse),
        list_models: Bodies(response=ModelList),
        retrieve_model: Bodies(response=ModelCard),
    }


def _summary(func) -> str:
    doc = inspect.getdoc(func) or inspect.getdoc(inspect.getmodule(func)) or ""
    return doc.strip().splitlines()[0] if doc.strip() else func.__name__


def _json_content(model: type[BaseModel]) -> dict:
    return {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}


def build_schema(routes: list[Route], title: str, version: str) -> dict[str, Any]:
    bodies = _bodies()
    models = {ErrorEnvelope, *(m for b in bodies.values() for m in (b.request, b.response) if m is not None)}
    _, definitions = models_json_schema([(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
                                        ref_template=REF)
    paths: dict[str, dict] = {}
    for endpoint in SchemaGenerator({}).get_endpoints(routes):
        handler = getattr(endpoint.func, "__wrapped__", endpoint.func)  # a keyed endpoint's own handler
        found = bodies.get(handler, Bodies())
        operation: dict[str, Any] = {
            "operationId": f"{handler.__name__}_{endpoint.http_method}",
            "summary": _summary(handler),
            "responses": {
                "200": {"description": "OK", **({"content": _json_content(found.response)} if found.response else {})},
                "default": {"description": "an error", "content": _json_content(ErrorEnvelope)},
            },
        }
        parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                      for name in re.findall(r"{(\w+)}", endpoint.path)]
        if parameters:
            operation["parameters"] = parameters
        if found.request:
            operation["requestBody"] = {"required": True, "content": _json_content(found.request)}
        if endpoint.path not in OPEN_PATHS:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(endpoint.path, {})[endpoint.http_method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi_schema(request: Request) -> Response:
    """This description of the gateway's HTTP API."""
    app = request.app
    schema = getattr(app.state, "openapi_schema", None)
    if schema is None:  # built at the first request, then kept: the routes do not change
        schema = app.state.openapi_schema = build_schema(app.routes, "selfroute", package_version())
    return json_response(schema)


def openapi_route() -> Route:
    return Route("/openapi.json", openapi_schema, methods=["GET"])
