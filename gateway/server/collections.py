"""Document collections over HTTP: list, inspect, add documents, delete a document or a whole collection; and who may see which.

A collection belongs to the key that created it (collection_owners in the ledger database); a named key
also sees the collections granted to it (`keys create --collections`). Collections nobody owns (ingested
with `selfroute ingest`) are the operator's: the admin key and the env/file keys see them, named keys only
by grant. To every other key a collection it may not see answers exactly as an absent one: 404. Attached
documents' inline collections are never reachable by name. An open gateway (no keys) has one tenant.

Adding documents is admitted (the key's budget and rates) and metered (gateway.server.context): its ledger
record is a pass-through with reason "ingest" and one leg, the embedding.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.ledger.entry import RequestLedgerEntry
from gateway.protocol import ChatCompletionRequest, InlineDocument, parse_json_object
from gateway.routing.embedding_model import embedding_config
from gateway.routing.request_limits import check_documents
from gateway.server import headers
from gateway.server.auth import Caller
from gateway.server.bodies import json_response
from gateway.server.context import RequestContext, keyed
from gateway.server.errors import collection_not_found
from gateway.server.injection import flag_headers, screen_documents
from gateway.server.state import Gateway
from pipelines.documents import Document
from pipelines.tokens import count_tokens
from policies.routes import PASSTHROUGH

if TYPE_CHECKING:  # pyarrow and lancedb load with the store, not with the app
    from pipelines.store import IngestReport

INGEST_REASON = "ingest"  # the ledger's reason for adding documents to a collection


class AddDocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    documents: list[InlineDocument] = Field(min_length=1)


def may_see(gateway: Gateway, caller: Caller, name: str, owners: dict[str, str] | None = None) -> bool:
    """Whether this caller may see (and so query, write and delete in) a collection."""
    if caller.open or caller.admin:
        return True
    if gateway.store.is_inline(name):
        return False
    owner = owners.get(name) if owners is not None else gateway.keys.collection_owner(name)
    if owner is not None and owner == caller.key_id:
        return True
    if caller.key is not None:
        return name in caller.key.collections
    return owner is None


def requested_collection(chat: ChatCompletionRequest, request: Request) -> str | None:
    return (chat.selfroute.collection if chat.selfroute else None) or request.headers.get(headers.COLLECTION)


def check_collection_access(gateway: Gateway, caller: Caller, name: str | None) -> None:
    """A chat or explain request naming a collection this caller may not see: the same 404 as an absent one."""
    if name and not may_see(gateway, caller, name):
        raise collection_not_found(name)


def _not_found(name: str) -> GatewayError:
    return collection_not_found(name, param=None, or_empty=False)


def _info_or_404(store, name: str):
    try:
        info = store.collection(name)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None
    if info is None:
        raise _not_found(name)
    return info


def _visible_info_or_404(gateway: Gateway, caller: Caller, name: str):
    if not may_see(gateway, caller, name):
        raise _not_found(name)
    return _info_or_404(gateway.store, name)


async def list_collections(ctx: RequestContext) -> Response:
    gateway, caller, store = ctx.gateway, ctx.caller, ctx.gateway.store

    def visible():
        owners = gateway.keys.collection_owners()
        return [i for i in store.collections(include_inline=False) if may_see(gateway, caller, i.name, owners)]

    infos = await anyio.to_thread.run_sync(visible)
    data = [
        {"name": i.name, "object": "collection", "document_count": len(i.documents), "chunk_count": i.chunk_count}
        for i in infos
    ]
    return json_response({"object": "list", "data": data})


async def get_collection(ctx: RequestContext) -> Response:
    info = await anyio.to_thread.run_sync(
        _visible_info_or_404, ctx.gateway, ctx.caller, ctx.request.path_params["name"]
    )
    return json_response({"object": "collection", **info.to_dict()})


def _parse_add_documents(raw: bytes) -> AddDocumentsRequest:
    body = parse_json_object(raw)
    try:
        return AddDocumentsRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise GatewayError(
            400, f"invalid value for '{param}': {err['msg']}", param=param, code="invalid_value"
        ) from None


def _check_sources(items: list[InlineDocument]) -> None:
    """metadata.source becomes the document's source, a text column of the store: any other JSON value (a number, an
    object) is the client's mistake, a 400 naming it (it was pyarrow's ArrowTypeError, a 500)."""
    for i, item in enumerate(items):
        source = item.metadata.get("source")
        if source is not None and not isinstance(source, str):
            raise GatewayError(
                400,
                f"invalid value for 'documents.{i}.metadata.source': a string, not a JSON {type(source).__name__}",
                param=f"documents.{i}.metadata.source",
                code="invalid_value",
            )


def _document(item: InlineDocument) -> Document:
    from pipelines.store import content_hash  # pyarrow and lancedb load with the store, not with the app

    doc = Document(
        id=item.id or "", text=item.text, title=item.title, source=item.metadata.get("source"), metadata=item.metadata
    )
    # named by content, so documents posted without ids in separate requests never replace each other
    return doc if item.id else replace(doc, id="doc-" + content_hash(doc)[:12])


def _check_writable(name: str) -> None:
    """400 for a name no client may write: invalid, or an inline collection's (`inline-*`, the gateway's own), for
    every caller, the admin key too: a document written there would be answered from as another key's attachment."""
    from pipelines.store import check_writable_name

    try:
        check_writable_name(name)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None


def _claim_for_writing(gateway: Gateway, caller: Caller, name: str) -> None:
    """A caller may write to a collection it may see; a new collection becomes the caller's."""
    try:
        exists = gateway.store.collection(name) is not None
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None
    if exists or gateway.keys.collection_owner(name) is not None:
        if not may_see(gateway, caller, name):
            raise _not_found(name)
    elif caller.key_id is not None and not caller.open and not caller.admin:
        # two keys creating the same name at once: the first claim wins, the other sees an absent collection
        if gateway.keys.claim_collection(name, caller.key_id) != caller.key_id:
            raise _not_found(name)


def _ingest(gateway: Gateway, name: str, documents: list[Document], entry: RequestLedgerEntry) -> IngestReport:
    """Embed and write the documents; the embedding is the request's one leg: the gateway's own model, at no
    cost, over the tokens of the documents it embedded (so they count in the key's tokens per minute)."""
    started = time.perf_counter()
    try:
        report = gateway.store.ingest(name, documents)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="name", code="invalid_collection") from None
    embedded = set(report.added) | set(report.updated)
    tokens = sum(count_tokens(d.text) for d in documents if d.id in embedded)
    model = embedding_config(gateway.policy)
    entry.add_call(
        model, PASSTHROUGH, {"prompt_tokens": tokens, "completion_tokens": 0}, (time.perf_counter() - started) * 1000.0
    )
    return report


async def add_documents(ctx: RequestContext) -> Response:
    gateway, caller, entry = ctx.gateway, ctx.caller, ctx.entry
    assert entry is not None  # metered
    entry.record.route, entry.record.reason = PASSTHROUGH, INGEST_REASON
    name = ctx.request.path_params["name"]
    _check_writable(name)
    payload = _parse_add_documents(ctx.body)
    _check_sources(payload.documents)
    check_documents(gateway.policy.request_limits, [d.text for d in payload.documents], "documents")
    # the gateway's own embedding model: the key's budget and rates (its TPM holds the documents' tokens), no model list
    await ctx.admit(None, embedded=(embedding_config(gateway.policy), [d.text for d in payload.documents]))
    found = await anyio.to_thread.run_sync(
        screen_documents, gateway.policy.security.injection, payload.documents, "documents", ctx.scope
    )
    documents = [_document(d) for d in payload.documents]
    await anyio.to_thread.run_sync(_claim_for_writing, gateway, caller, name)
    report = await anyio.to_thread.run_sync(_ingest, gateway, name, documents, entry)
    body = {"object": "ingest_report", **report.to_dict(), **({"flags": found} if found else {})}
    return json_response(body, status=201 if report.added else 200, headers=flag_headers(found))


async def delete_document(ctx: RequestContext) -> Response:
    gateway, caller, store = ctx.gateway, ctx.caller, ctx.gateway.store
    name, doc_id = ctx.request.path_params["name"], ctx.request.path_params["doc_id"]
    await anyio.to_thread.run_sync(_visible_info_or_404, gateway, caller, name)
    deleted = await anyio.to_thread.run_sync(store.delete_document, name, doc_id)
    if not deleted:
        raise GatewayError(404, f"document {doc_id!r} is not in collection {name!r}", code="document_not_found")
    return json_response({"id": doc_id, "object": "document", "collection": name, "deleted": True})


async def delete_collection(ctx: RequestContext) -> Response:
    gateway, caller, store = ctx.gateway, ctx.caller, ctx.gateway.store
    name = ctx.request.path_params["name"]
    info = await anyio.to_thread.run_sync(_visible_info_or_404, gateway, caller, name)
    await anyio.to_thread.run_sync(store.delete_collection, name)
    # The documents go; the name stays its owner's (collection_owners), as a key's name is never reused: the
    # owner can create it again, while another key re-creating it would inherit the grants (`--collections`) and
    # the requests that still name it, and read or receive what was meant for the owner.
    kept = gateway.keys.collection_owner(name) is not None
    return json_response(
        {
            "id": name,
            "object": "collection",
            "deleted": True,
            "name_kept": kept,
            "document_count": len(info.documents),
            "chunk_count": info.chunk_count,
        }
    )


def collection_routes() -> list[Route]:
    return [
        Route("/v1/collections", keyed(list_collections), methods=["GET"]),
        Route("/v1/collections/{name}", keyed(get_collection), methods=["GET"]),
        Route("/v1/collections/{name}", keyed(delete_collection), methods=["DELETE"]),
        Route("/v1/collections/{name}/documents", keyed(add_documents, metered=True), methods=["POST"]),
        Route("/v1/collections/{name}/documents/{doc_id:path}", keyed(delete_document), methods=["DELETE"]),
    ]
