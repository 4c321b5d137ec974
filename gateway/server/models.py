"""GET /v1/models and GET /v1/models/{id}: the routed aliases, the models they use and the embedding model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.routing.embedding_model import local_embedding_model
from gateway.server.auth import Caller
from gateway.server.bodies import json_response
from gateway.server.context import RequestContext, keyed
from gateway.server.limits import model_usable
from gateway.server.state import Gateway


class ModelCard(BaseModel):
    """OpenAI's model object."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def _cards(gateway: Gateway, caller: Caller) -> list[ModelCard]:
    """The models this caller may use: the policy's aliases and models, and the embedding model."""
    policy = gateway.policy
    cards = [ModelCard(id=alias, owned_by="selfroute") for alias in policy.aliases]
    for config in {policy.cheap.model: policy.cheap, policy.long.model: policy.long}.values():
        provider = config.model.partition("/")[0] if "/" in config.model else "openai"
        cards.append(ModelCard(id=config.model, owned_by=provider))
    cards.append(ModelCard(id=local_embedding_model(policy), owned_by="local"))
    return [card for card in cards if model_usable(policy, caller, card.id)]


async def list_models(ctx: RequestContext) -> Response:
    return json_response(ModelList(data=_cards(ctx.gateway, ctx.caller)).model_dump())


async def retrieve_model(ctx: RequestContext) -> Response:
    model_id = ctx.request.path_params["model_id"]  # may hold '/': openai/gpt-4o-mini, local/...
    for card in _cards(ctx.gateway, ctx.caller):  # one this key may not use is as absent as an unknown one
        if card.id == model_id:
            return json_response(card.model_dump())
    raise GatewayError(404, f"the model {model_id[:256]!r} does not exist", param="model", code="model_not_found")


def model_routes() -> list[Route]:
    return [
        Route("/v1/models", keyed(list_models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", keyed(retrieve_model), methods=["GET"]),
    ]
