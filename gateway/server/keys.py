"""Named API keys over HTTP (admin key required):

POST   /v1/admin/keys          {"name", "models", "collections", "budget_usd", "rpm", "tpm", "expires"} -> the key, once
GET    /v1/admin/keys          every key with its limits and the spend the ledger recorded for it
DELETE /v1/admin/keys/{name}   revoke (the name is never reused)
"""
from __future__ import annotations

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.ledger.keys import KeyConflict, expiry_time
from gateway.protocol import parse_json_object
from gateway.server.bodies import json_response
from gateway.server.context import RequestContext, keyed

MAX_KEYS_BODY = 64 * 1024


class CreateKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    models: list[str] | None = None
    collections: list[str] | None = None
    budget_usd: float | None = None
    rpm: int | None = None
    tpm: int | None = None
    expires: str | None = Field(None, description="an age from now: 30m, 12h, 30d, 8w")


async def create_key(ctx: RequestContext) -> Response:
    gateway = ctx.gateway
    body = parse_json_object(ctx.body)
    try:
        spec = CreateKeyRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise GatewayError(400, f"invalid value for '{param}': {err['msg']}", param=param, code="invalid_value") from None

    def create():
        expires_at = expiry_time(spec.expires) if spec.expires else None
        return gateway.keys.create(spec.name, models=spec.models, collections=spec.collections,
                                   budget_usd=spec.budget_usd, rpm=spec.rpm, tpm=spec.tpm, expires_at=expires_at)

    try:
        key, secret = await anyio.to_thread.run_sync(create)
    except KeyConflict as exc:
        raise GatewayError(409, exc.message, param=exc.param, code=exc.code) from None
    gateway.auth.forget()
    return json_response({**key.to_dict(), "key": secret}, status=201)


async def list_keys(ctx: RequestContext) -> Response:
    gateway = ctx.gateway

    def listing():
        keys = gateway.keys.list()
        spend = gateway.keys.spend()
        return [k.to_dict(spend_usd=spend.get(k.name, 0.0)) for k in keys]

    return json_response({"object": "list", "data": await anyio.to_thread.run_sync(listing)})


async def revoke_key(ctx: RequestContext) -> Response:
    gateway = ctx.gateway
    key = await anyio.to_thread.run_sync(gateway.keys.revoke, ctx.request.path_params["name"])
    gateway.auth.forget()
    return json_response(key.to_dict())


def key_routes() -> list[Route]:
    return [
        Route("/v1/admin/keys", keyed(create_key, admin=True, body_limit=MAX_KEYS_BODY), methods=["POST"]),
        Route("/v1/admin/keys", keyed(list_keys, admin=True), methods=["GET"]),
        Route("/v1/admin/keys/{name}", keyed(revoke_key, admin=True), methods=["DELETE"]),
    ]
