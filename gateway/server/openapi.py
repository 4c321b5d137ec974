"""GET /openapi.json: an OpenAPI 3.1 description of every route the app serves; GET /docs: Swagger UI over it.

The paths and methods come from the app's own routes (Starlette's SchemaGenerator), so a new route appears
without anyone writing it down. Each operation's summary, description and bodies are in OPERATIONS, keyed by
the handler: request and response bodies are the JSON schemas of pydantic models (the ones the handlers validate
with and answer from where they have them, else the models below that describe what they answer), under
components/schemas; tests validate real answers against them. A handler missing from OPERATIONS fails the test.

Swagger UI's files come from the `swagger-ui-bundle-v2` package (Swagger UI 5, which reads OpenAPI 3.1), served
from /docs/assets: the page loads nothing from any other host."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.schemas import SchemaGenerator

from gateway.server.bodies import json_response
from gateway.settings import package_version

REF = "#/components/schemas/{model}"
OPEN_PATHS = {"/healthz", "/health/liveness", "/health/readiness", "/metrics", "/openapi.json", "/dashboard", "/docs"}
DOCS_ASSETS = "/docs/assets"


class _Open(BaseModel):
    """An answer that may carry more fields than those named (new ones are added without breaking clients)."""

    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(BaseModel):
    """Every error: OpenAI's envelope."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(_Open):
    """200 ready; 503 starting (reason not_ready) or failed (reason build_failed)."""

    status: Literal["ready", "starting", "failed"]
    reason: str | None = None
    policy_generation: int | None = None  # the policy reload generation this process's models came with
    reload_failed: bool | None = None  # true while this process's last policy reload failed


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SelfrouteInfo(_Open):
    """Routed answers: the route and why, the classifier's probability, what was sent (provenance)."""

    route: str
    reason: str | None = None
    request_id: str


class ChatCompletion(_Open):
    """OpenAI's chat.completion; a routed answer adds its `selfroute` object. With `stream: true` the answer is
    server-sent events of chat.completion.chunk objects ending with `data: [DONE]`."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage | None = None
    selfroute: SelfrouteInfo | None = None


class CollectionSummary(_Open):
    name: str
    object: Literal["collection"]
    document_count: int
    chunk_count: int


class CollectionList(BaseModel):
    object: Literal["list"]
    data: list[CollectionSummary]


class DocumentInfo(_Open):
    id: str
    title: str | None
    source: str | None
    tokens: int
    sections: list[str]
    cross_refs: int
    chunks: int
    content_hash: str
    metadata: dict[str, Any]


class Collection(_Open):
    object: Literal["collection"]
    name: str
    document_count: int
    chunk_count: int
    documents: list[DocumentInfo]


class IngestReport(_Open):
    """201 when a document was added, else 200; `flags` lists injection findings (security.injection: flag)."""

    object: Literal["ingest_report"]
    collection: str
    added: list[str]
    updated: list[str]
    unchanged: list[str]
    chunks_written: int
    seconds: float


class DeletedDocument(BaseModel):
    id: str
    object: Literal["document"]
    collection: str
    deleted: bool


class DeletedCollection(BaseModel):
    id: str
    object: Literal["collection"]
    deleted: bool
    name_kept: bool
    document_count: int
    chunk_count: int


class RouteExplanation(_Open):
    object: Literal["route.explanation"]
    route: str
    reason: str
    rule: str | None
    probability: float | None
    threshold: float | None
    source: str
    question: str
    context_tokens: int
    features: dict[str, Any]
    estimates: dict[str, dict[str, Any]]
    fallback: dict[str, Any]


class LedgerRequest(_Open):
    """One request as the ledger lists it: `id` is the gateway's, `client_request_id` the client's X-Request-Id."""

    id: str
    created_at: float
    key_id: str | None
    policy: str | None
    alias: str | None
    route: str | None
    reason: str | None
    status: int
    error: str | None
    stream: bool
    latency_ms: float | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    context_tokens: int
    counterfactual_cost_usd: float
    cached_tokens: int
    cache_saving_usd: float
    client_request_id: str | None
    models: list[str]


class RequestPage(BaseModel):
    object: Literal["list"]
    data: list[LedgerRequest]
    has_more: bool
    next_cursor: str | None


class Leg(_Open):
    model: str
    route: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_ms: float | None
    error: str | None


class RequestDetail(LedgerRequest):
    saving_usd: float
    provenance: dict[str, Any] | None
    calls: list[Leg]


class CostRow(_Open):
    group: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class CostReport(_Open):
    by: str
    groups: list[CostRow]
    total: CostRow
    unpriced_models: list[dict[str, Any]]


class Summary(_Open):
    """What the dashboard draws over the window."""

    now: float
    since: float
    window_s: float
    routes: list[str]
    totals: dict[str, Any]
    series: list[dict[str, Any]]


class ApiKey(_Open):
    name: str
    object: Literal["api_key"]
    prefix: str
    models: list[str] | None
    collections: list[str]
    budget_usd: float | None
    rpm: int | None
    tpm: int | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    active: bool


class CreatedApiKey(ApiKey):
    key: str  # shown once


class ApiKeyList(BaseModel):
    object: Literal["list"]
    data: list[ApiKey]


class FeedbackLabel(BaseModel):
    object: Literal["feedback"]
    request_id: str
    good: bool
    score: float | None


class ReloadProcess(_Open):
    """One serving process: what it routes with and how it followed the policy reloads (gateway.server.reloads)."""

    id: str  # host:pid:start time
    host: str
    pid: int
    ready: bool
    generation: int  # the newest reload generation it acted on (-1: not read yet)
    loaded_generation: int | None  # the one its models came with
    last_error: dict[str, Any] | None  # {generation (null: its own admin call), at, error} of a reload that failed
    policy_sha256: str | None
    classifier: dict[str, Any] | None  # model_path, sha256, threshold
    verifier: dict[str, Any] | None  # model_path, sha256, threshold, refusal_threshold


class FleetProcess(ReloadProcess):
    updated_at: float  # when it last wrote its row
    stale: bool  # silent for more than three heartbeats (stopped without saying so, or cut off)


class PolicyReload(BaseModel):
    reloaded: bool
    generation: int | None  # null: the ledger could not record it, only this process reloaded
    classifier: dict[str, Any] | None
    verifier: dict[str, Any] | None
    process: ReloadProcess


class ReloadStatus(BaseModel):
    generation: int  # the newest on the ledger
    process: ReloadProcess  # the one that answered
    processes: list[FleetProcess]  # every process on the ledger


class OpenApiDocument(_Open):
    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


@dataclass(frozen=True)
class Operation:
    summary: str
    description: str = ""
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    media: str = "application/json"  # of the success answer
    statuses: tuple[str, ...] = ("200",)  # the success statuses, each with this answer
    stream: bool = False  # the answer may be an event stream instead (stream: true)


def operations() -> dict[Any, Operation]:
    """Each handler's operation (imported here, when the schema is first built, not with the app)."""
    from gateway.protocol import ChatCompletionRequest
    from gateway.server.admin import (
        costs,
        dashboard,
        get_request,
        list_requests,
        reload_policy,
        reload_status,
        summary,
    )
    from gateway.server.chat import chat_completions
    from gateway.server.collections import (
        AddDocumentsRequest,
        add_documents,
        delete_collection,
        delete_document,
        get_collection,
        list_collections,
    )
    from gateway.server.embeddings import EmbeddingsRequest, EmbeddingsResponse, create_embeddings
    from gateway.server.explain import explain_route
    from gateway.server.feedback import FeedbackRequest, feedback
    from gateway.server.health import liveness, readiness
    from gateway.server.keys import (
        CreateKeyRequest,
        EditKeyRequest,
        create_key,
        edit_key,
        list_keys,
        revoke_key,
        rotate_key,
    )
    from gateway.server.metrics import metrics_endpoint
    from gateway.server.models import ModelCard, ModelList, list_models, retrieve_model

    return {
        liveness: Operation("Liveness probe", "200 as soon as the server listens.", response=Health),
        readiness: Operation(
            "Readiness probe",
            "200 once the embedding model, store and classifier are loaded; "
            "503 with a stable reason before (or after a failed start).",
            response=Readiness,
        ),
        list_models: Operation(
            "List models",
            "The routed aliases, the models they use and the embedding model this key may use.",
            response=ModelList,
        ),
        retrieve_model: Operation(
            "Retrieve a model", "404 model_not_found for a name this key cannot use.", response=ModelCard
        ),
        chat_completions: Operation(
            "Create a chat completion",
            "OpenAI's chat completions. A routed alias (`selfroute`) picks a route per "
            "request (headers x-selfroute-route, x-selfroute-reason, x-selfroute-cost-usd; a `selfroute` object in "
            "the body); any other model name is passed through. `stream: true` answers server-sent events.",
            request=ChatCompletionRequest,
            response=ChatCompletion,
            stream=True,
        ),
        create_embeddings: Operation(
            "Create embeddings",
            "The gateway's own embedding model in-process, other models through the OpenAI-compatible upstream.",
            request=EmbeddingsRequest,
            response=EmbeddingsResponse,
        ),
        list_collections: Operation("List collections", "The collections this key may see.", response=CollectionList),
        get_collection: Operation(
            "Show a collection", "Its documents: tokens, sections, cross-references, chunks.", response=Collection
        ),
        delete_collection: Operation(
            "Delete a collection", "Its documents go; the name stays its owner's.", response=DeletedCollection
        ),
        add_documents: Operation(
            "Add documents to a collection",
            "Chunk, embed and store them (unchanged ones are "
            "skipped); creates the collection. 201 when a document was added, else 200.",
            request=AddDocumentsRequest,
            response=IngestReport,
            statuses=("201", "200"),
        ),
        delete_document: Operation("Delete a document", response=DeletedDocument),
        explain_route: Operation(
            "Explain the routing decision",
            "The decision for a chat body, its features and "
            "each route's estimated tokens and cost; no model is called.",
            request=ChatCompletionRequest,
            response=RouteExplanation,
        ),
        list_requests: Operation(
            "List ledgered requests",
            "Newest first, filtered (route, key, policy, status, since, until), paged by cursor.",
            response=RequestPage,
        ),
        get_request: Operation(
            "Show a ledgered request", "With its legs, provenance and saving.", response=RequestDetail
        ),
        costs: Operation(
            "Costs by group",
            "Spend, always-long counterfactual and saving per route, model, policy, key, day or hour.",
            response=CostReport,
        ),
        summary: Operation("Dashboard data", "What the dashboard draws over a window.", response=Summary),
        reload_policy: Operation(
            "Reload the routing models",
            "The policy file's routing.classifier and routing.verifier (model files and thresholds, as `selfroute "
            "learn` writes them) put in force in this process without a restart, then in every worker and replica "
            "on the ledger within seconds; 409 reload_failed keeps those in force and tells no other process.",
            response=PolicyReload,
        ),
        reload_status: Operation(
            "What routing models are in force where",
            "This process and every process on the ledger: model files' sha256, thresholds, the reload generation "
            "each follows and its last reload error.",
            response=ReloadStatus,
        ),
        dashboard: Operation(
            "Cost dashboard", "The page; its data comes from /v1/admin/summary with the admin key.", media="text/html"
        ),
        create_key: Operation(
            "Create a named key",
            "The key is in this answer once (with a `notice` when it is the first key: the gateway is no longer open).",
            request=CreateKeyRequest,
            response=CreatedApiKey,
            statuses=("201",),
        ),
        edit_key: Operation(
            "Edit a named key",
            "Its limits and grants: the fields given; null clears one.",
            request=EditKeyRequest,
            response=ApiKey,
        ),
        rotate_key: Operation(
            "Rotate a named key",
            "A new secret for the same name and limits, in this answer once; the old one stops working.",
            response=CreatedApiKey,
        ),
        list_keys: Operation("List named keys", "With their limits and spend.", response=ApiKeyList),
        revoke_key: Operation("Revoke a named key", "Names are never reused.", response=ApiKey),
        feedback: Operation(
            "Judge an answer",
            "A client's own judgement of one of its answers (by the gateway's "
            "request id, x-selfroute-request-id), kept as a label for the router.",
            request=FeedbackRequest,
            response=FeedbackLabel,
            statuses=("201",),
        ),
        metrics_endpoint: Operation(
            "Prometheus metrics", "Text format, one view over every worker.", media="text/plain"
        ),
        openapi_schema: Operation("This OpenAPI description", response=OpenApiDocument),
        docs: Operation("API documentation", "Swagger UI over /openapi.json.", media="text/html"),
    }


def _json_content(model: type[BaseModel]) -> dict:
    return {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}


def _success(found: Operation) -> dict[str, Any]:
    if found.response is not None:
        content = _json_content(found.response)
    else:
        content = {found.media: {"schema": {"type": "string"}}}
    if found.stream:
        content["text/event-stream"] = {"schema": {"type": "string", "description": "chat.completion.chunk events"}}
    return {"description": found.summary, "content": content}


def build_schema(routes: list[BaseRoute], title: str, version: str) -> dict[str, Any]:
    known = operations()
    models: set[type[BaseModel]] = {
        ErrorEnvelope,
        *(m for op in known.values() for m in (op.request, op.response) if m is not None),
    }
    _, definitions = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=REF
    )
    paths: dict[str, dict] = {}
    used: set[str] = set()
    for endpoint in SchemaGenerator({}).get_endpoints(routes):
        handler = getattr(endpoint.func, "__wrapped__", endpoint.func)  # a keyed endpoint's own handler
        found = known.get(handler)
        if found is None:
            raise KeyError(f"{handler.__module__}.{handler.__name__} has no entry in gateway.server.openapi")
        operation_id = f"{handler.__name__}_{endpoint.http_method}"
        if operation_id in used:  # a second path to the same handler (/healthz, /chat/completions)
            operation_id = re.sub(r"\W+", "_", f"{operation_id}{endpoint.path}").rstrip("_")
        used.add(operation_id)
        operation: dict[str, Any] = {
            "operationId": operation_id,
            "summary": found.summary,
            "responses": {
                **{status: _success(found) for status in found.statuses},
                "default": {"description": "an error (OpenAI's envelope)", "content": _json_content(ErrorEnvelope)},
            },
        }
        if found.description:
            operation["description"] = found.description
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", endpoint.path)
        ]
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


DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>selfroute API</title>
  <link rel="stylesheet" href="{assets}/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{assets}/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({{url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true}});
  </script>
</body>
</html>
"""


async def docs(request: Request) -> Response:
    return HTMLResponse(DOCS_PAGE.format(assets=DOCS_ASSETS), headers={"referrer-policy": "no-referrer"})


def openapi_route() -> Route:
    return Route("/openapi.json", openapi_schema, methods=["GET"])


def docs_routes() -> list[BaseRoute]:
    """/docs and Swagger UI's files, from the installed package (no CDN)."""
    from starlette.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    return [
        Route("/docs", docs, methods=["GET"]),
        Mount(DOCS_ASSETS, app=StaticFiles(directory=str(swagger_ui_path)), name="docs-assets"),
    ]
