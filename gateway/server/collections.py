"""Document collections over HTTP: list, inspect, add documents, delete a document."""
from __future__ import annotations

from dataclasses import replace

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.protocol import InlineDocument, parse_json_object
from gateway.server.bodies import json_response, read_body
from gateway.server.state import gateway_of
from pipelines.documents import Document


class AddDocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    documents: list[InlineDocument] = Field(min_length=1)


def _store(request: Request):
    """The document store, for an authenticated caller."""
    gateway = gateway_of(request)
    gateway.auth.check(request)
    return gateway.store


def _info_or_404(store, name: str):
    try:
        info = store.collection(name)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None
    if info is None:
        raise GatewayError(404, f"collection {name!r} does not exist", code="collection_not_found")
    return info


async def list_collections(request: Request) -> Response:
    store = _store(request)
    infos = await anyio.to_thread.run_sync(lambda: store.collections(include_inline=False))
    data = [
        {"name": i.name, "object": "collection", "document_count": len(i.documents), "chunk_count": i.chunk_count}
        for i in infos
    ]
    return json_response({"object": "list", "data": data})


async def get_collection(request: Request) -> Response:
    store = _store(request)
    info = await anyio.to_thread.run_sync(_info_or_404, store, request.path_params["name"])
    return json_response({"object": "collection", **info.to_dict()})


def _parse_add_documents(raw: bytes) -> AddDocumentsRequest:
    body = parse_json_object(raw)
    try:
        return AddDocumentsRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise GatewayError(400, f"invalid value for '{param}': {err['msg']}", param=param, code="invalid_value") from None


def _document(item: InlineDocument) -> Document:
    from pipelines.store import content_hash  # pyarrow and lancedb load with the store, not with the app

    doc = Document(id=item.id or "", text=item.text, title=item.title, source=item.metadata.get("source"),
                   metadata=item.metadata)
    # named by content, so documents posted without ids in separate requests never replace each other
    return doc if item.id else replace(doc, id="doc-" + content_hash(doc)[:12])


async def add_documents(request: Request) -> Response:
    store = _store(request)
    raw = await read_body(request, gateway_of(request).settings.max_body_bytes)
    payload = _parse_add_documents(raw)
    documents = [_document(d) for d in payload.documents]
    name = request.path_params["name"]
    try:
        report = await anyio.to_thread.run_sync(store.ingest, name, documents)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None
    return json_response({"object": "ingest_report", **report.to_dict()}, status=201 if report.added else 200)


async def delete_document(request: Request) -> Response:
    store = _store(request)
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
