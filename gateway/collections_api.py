"""Document collections over HTTP: list, inspect, add documents, delete a document."""
from __future__ import annotations

import json

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.chat import json_response, read_body
from gateway.errors import GatewayError
from gateway.protocol import InlineDocument


class AddDocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    documents: list[InlineDocument] = Field(min_length=1)


def _service(request: Request):
    gateway = request.app.state.gateway
    gateway.auth.check(request)
    return gateway.routing


def _info_or_404(store, name: str):
    try:
        info = store.collection(name)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None
    if info is None:
        raise GatewayError(404, f"collection {name!r} does not exist", code="collection_not_found")
    return info


async def list_collections(request: Request) -> Response:
    store = _service(request).store
    infos = await anyio.to_thread.run_sync(store.collections)
    data = [
        {"name": i.name, "object": "collection", "document_count": len(i.documents), "chunk_count": i.chunk_count}
        for i in infos if not store.is_inline(i.name)
    ]
    return json_response({"object": "list", "data": data})


async def get_collection(request: Request) -> Response:
    store = _service(request).store
    info = await anyio.to_thread.run_sync(_info_or_404, store, request.path_params["name"])
    return json_response({"object": "collection", **info.to_dict()})


async def add_documents(request: Request) -> Response:
    service = _service(request)
    raw = await read_body(request, request.app.state.gateway.settings.max_body_bytes)
    try:
        payload = AddDocumentsRequest.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise GatewayError(400, f"invalid value for '{param}': {err['msg']}", param=param, code="invalid_value") from None
    from pipelines.documents import Document

    documents = [
        Document(id=d.id or f"doc-{i + 1}", text=d.text, title=d.title, source=d.metadata.get("source"),
                 metadata=d.metadata)
        for i, d in enumerate(payload.documents)
    ]
    name = request.path_params["name"]
    try:
        report = await anyio.to_thread.run_sync(service.store.ingest, name, documents)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None
    return json_response({"object": "ingest_report", **report.to_dict()}, status=201 if report.added else 200)


async def delete_document(request: Request) -> Response:
    store = _service(request).store
    name, doc_id = request.path_params["name"], request.path_params["doc_id"]
    await anyio.to_thread.run_sync(_info_or_404, store, name)
    deleted = await anyio.to_thread.run_sync(store.delete_document, name, doc_id)
    if not deleted:
        raise GatewayError(404, f"document {doc_id!r} is not in collection {name!r}", code="document_not_found")
    return json_response({"id": doc_id, "object": "document", "collection": name, "deleted": True})


def collection_routes() -> list[Route]:
    return [
        Route("/v1/collections", list_collections, methods=["GET"]),
        Route("/v1/collections/{name}", get_collection, methods=["GET"]),
        Route("/v1/collections/{name}/documents", add_documents, methods=["POST"]),
        Route("/v1/collections/{name}/documents/{doc_id:path}", delete_document, methods=["DELETE"]),
    ]
