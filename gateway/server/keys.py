"""Named API keys over HTTP (admin key required):

POST   /v1/admin/keys                {"name", "models", "collections", "budget_usd", "budget_period", "rpm", "tpm",
                                     "expires", "admin"} -> the key, once (and a `notice` when it is the first)
GET    /v1/admin/keys                every key with its limits and the spend the ledger recorded for it
PATCH  /v1/admin/keys/{name}         change the fields given (null clears a limit; models null: any model)
POST   /v1/admin/keys/{name}/rotate  a new secret for the key, once; the old one stops working
DELETE /v1/admin/keys/{name}         revoke (the name is never reused; a `notice` when it was the last key)
"""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.ledger.keys import KEEP, KeyConflict, expiry_time, period_seconds
from gateway.protocol import parse_json_object
from gateway.server.bodies import json_response
from gateway.server.context import RequestContext, keyed

MAX_KEYS_BODY = 64 * 1024


class CreateKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "admin": "yes" made an admin key (probe11)
    name: str = Field(min_length=1, max_length=64)
    models: list[str] | None = None
    collections: list[str] | None = None
    budget_usd: float | None = None
    rpm: int | None = None
    tpm: int | None = None
    expires: str | None = Field(None, description="an age from now: 30m, 12h, 30d, 8w")
    budget_period: str | None = Field(None, description="the budget holds per period: 1h, 24h, 7d, 30d, 4w")
    admin: bool = Field(False, description="the admin key: admin endpoints, dashboard, every collection, no limits")


class EditKeyRequest(BaseModel):
    """What is given changes; null clears a limit (models: any model; expires: never)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    models: list[str] | None = None
    collections: list[str] | None = None
    budget_usd: float | None = None
    budget_period: str | None = None
    rpm: int | None = None
    tpm: int | None = None
    expires: str | None = None


FIRST_KEY_NOTICE = (
    "the gateway's first key: it was open to anyone and now needs a key on every request (within 2 s "
    "on other processes); the dashboard and /v1/admin/* need the admin key (POST /v1/admin/keys with "
    '"admin": true, `selfroute keys create --admin`, or SELFROUTE_ADMIN_KEY); collections nobody '
    "owns are this key's only by grant; revoking it opens the gateway again"
)
LAST_KEY_NOTICE = (
    "the last key in the key store: the gateway returns to its configured mode, open to anyone unless "
    "it was started with SELFROUTE_API_KEYS, --keys-file or SELFROUTE_ADMIN_KEY"
)


M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], body: dict) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise GatewayError(
            400, f"invalid value for '{param}': {err['msg']}", param=param, code="invalid_value"
        ) from None


async def create_key(ctx: RequestContext) -> Response:
    gateway = ctx.gateway
    spec = _parse(CreateKeyRequest, parse_json_object(ctx.body))

    def create():
        expires_at = expiry_time(spec.expires) if spec.expires else None
        period = period_seconds(spec.budget_period) if spec.budget_period else None
        first = not gateway.keys.any_keys()
        key, secret = gateway.keys.create(
            spec.name,
            models=spec.models,
            collections=spec.collections,
            budget_usd=spec.budget_usd,
            rpm=spec.rpm,
            tpm=spec.tpm,
            expires_at=expires_at,
            admin=spec.admin,
            budget_period_s=period,
        )
        return key, secret, first

    try:
        key, secret, first = await anyio.to_thread.run_sync(create)
    except KeyConflict as exc:
        raise GatewayError(409, exc.message, param=exc.param, code=exc.code) from None
    gateway.auth.forget()
    answer = {**key.to_dict(), "key": secret}
    if first and gateway.auth.open_before_keys:
        answer["notice"] = FIRST_KEY_NOTICE
    return json_response(answer, status=201)


async def edit_key(ctx: RequestContext) -> Response:
    gateway = ctx.gateway
    body = parse_json_object(ctx.body)
    spec = _parse(EditKeyRequest, body)
    given = spec.model_fields_set

    def edit():
        changes: dict[str, Any] = {
            field: getattr(spec, field)
            for field in ("models", "collections", "budget_usd", "rpm", "tpm")
            if field in given
        }
        if "budget_period" in given:
            changes["budget_period_s"] = period_seconds(spec.budget_period) if spec.budget_period else None
        if "expires" in given:
            changes["expires_at"] = expiry_time(spec.expires) if spec.expires else None
        if not changes:
            raise GatewayError(400, "nothing to change", code="invalid_value")
        return gateway.keys.edit(ctx.request.path_params["name"], **{k: changes.get(k, KEEP) for k in changes})

    key = await anyio.to_thread.run_sync(edit)
    gateway.auth.forget()
    return json_response(key.to_dict())


async def rotate_key(ctx: RequestContext) -> Response:
    gateway = ctx.gateway
    key, secret = await anyio.to_thread.run_sync(gateway.keys.rotate, ctx.request.path_params["name"])
    gateway.auth.forget()
    return json_response({**key.to_dict(), "key": secret})


async def list_keys(ctx: RequestContext) -> Response:
    gateway = ctx.gateway

    return json_response({"object": "list", "data": await anyio.to_thread.run_sync(gateway.keys.listing)})


async def revoke_key(ctx: RequestContext) -> Response:
    gateway = ctx.gateway

    def revoke():
        return gateway.keys.revoke(ctx.request.path_params["name"]), not gateway.keys.any_keys()

    key, last = await anyio.to_thread.run_sync(revoke)
    gateway.auth.forget()
    answer = key.to_dict()
    if last:
        answer["notice"] = LAST_KEY_NOTICE
    return json_response(answer)


def key_routes() -> list[Route]:
    return [
        Route("/v1/admin/keys", keyed(create_key, admin=True, body_limit=MAX_KEYS_BODY), methods=["POST"]),
        Route("/v1/admin/keys", keyed(list_keys, admin=True), methods=["GET"]),
        Route("/v1/admin/keys/{name}", keyed(revoke_key, admin=True), methods=["DELETE"]),
        Route("/v1/admin/keys/{name}", keyed(edit_key, admin=True, body_limit=MAX_KEYS_BODY), methods=["PATCH"]),
        Route("/v1/admin/keys/{name}/rotate", keyed(rotate_key, admin=True), methods=["POST"]),
    ]
