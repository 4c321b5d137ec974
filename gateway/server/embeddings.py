"""POST /v1/embeddings: the gateway's own embedding model (the one it retrieves with, e.g.
`local/all-minilm-l6-v2`) answers in-process; other model names go to the OpenAI-compatible upstream."""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import anyio
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.ledger.entry import RequestLedgerEntry
from gateway.protocol import MAX_MODEL_CHARS, ChatCompletionRequest, parse_json_object, refuse_connection_params
from gateway.routing.embedding_model import PACKAGED_EMBEDDING_MODEL, embedding_config, local_embedding_model
from gateway.routing.request_limits import check_embedding_inputs
from gateway.server.bodies import json_response
from gateway.server.context import RequestContext, keyed
from gateway.upstreams.errors import UpstreamError
from policies.routes import PASSTHROUGH
from policies.schema import ModelConfig


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request; unknown fields go upstream as sent."""

    model_config = ConfigDict(extra="allow", strict=True)  # as chat's: validated as sent (gateway.protocol)
    model: str = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str) -> str:
        return ChatCompletionRequest._model_name(value)  # the same names as chat


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


def _parse(raw: bytes) -> tuple[EmbeddingsRequest, dict[str, Any]]:
    body = parse_json_object(raw)
    refuse_connection_params(body)  # the same closed surface as chat
    try:
        request = EmbeddingsRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = str(err["loc"][0]) if err["loc"] else None
        raise GatewayError(
            400, f"invalid value for '{param}': {err['msg']}", param=param, code="invalid_value"
        ) from None
    if request.input == [] or request.input == "":
        raise GatewayError(400, "'input' must not be empty", param="input", code="invalid_value")
    body.pop("selfroute", None)  # the gateway's own extension, as chat drops it: never sent to a provider (probe11)
    return request, body


def _texts(request: EmbeddingsRequest) -> list[str]:
    items = [request.input] if isinstance(request.input, str) else request.input
    texts = [item for item in items if isinstance(item, str)]
    if len(texts) != len(items):
        raise GatewayError(
            400,
            f"{request.model} takes text input; token arrays belong to another tokenizer",
            param="input",
            code="unsupported_parameter",
        )
    return texts


def _embed_local(embedder, texts: list[str]) -> tuple[np.ndarray, int]:
    vectors = embedder.embed(texts)
    # the tokens the model actually read: its own tokenizer, truncated where the model truncates
    return vectors, sum(embedder.token_counts(texts))


def _encode(vector: np.ndarray, encoding_format: str | None) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def _local(gateway, request: EmbeddingsRequest, name: str, entry: RequestLedgerEntry) -> dict[str, Any]:
    texts = _texts(request)
    check_embedding_inputs(gateway.policy.request_limits, texts)  # the gateway's own CPU: bounded per request
    embedder = gateway.store.embedder  # 503 until the store (and its model) is loaded
    started = time.perf_counter()
    vectors, tokens = await anyio.to_thread.run_sync(_embed_local, embedder, texts)
    if request.dimensions is not None and request.dimensions != vectors.shape[1]:
        raise GatewayError(
            400,
            f"{name} has {vectors.shape[1]} dimensions and cannot shorten them",
            param="dimensions",
            code="unsupported_parameter",
        )
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    entry.add_call(
        embedding_config(gateway.policy),  # name is its model's: local_embedding_model(policy)
        PASSTHROUGH,
        usage,
        (time.perf_counter() - started) * 1000.0,
    )
    data = [Embedding(index=i, embedding=_encode(v, request.encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingsResponse(data=data, model=name, usage=EmbeddingsUsage(**usage)).model_dump()


def _upstream_config(gateway, model: str) -> ModelConfig:
    from gateway.routing.service import passthrough_config

    return passthrough_config(gateway.policy, model)


def _priced_config(gateway, model: str) -> ModelConfig:
    """The model's prices for its reservation; a name refused later (after the key's checks, as before) is priced
    as unknown."""
    from gateway.routing.errors import ModelNotFound

    try:
        return _upstream_config(gateway, model)
    except ModelNotFound:
        return ModelConfig(model=model)


async def _upstream(gateway, request: EmbeddingsRequest, body: dict[str, Any], entry: RequestLedgerEntry) -> dict:
    from gateway.upstreams.embeddings import passes_through, upstream_embeddings

    if not passes_through(request.model):
        raise GatewayError(
            400,
            f"embeddings for {request.model!r} are not offered: use {PACKAGED_EMBEDDING_MODEL} "
            "or an OpenAI-compatible model",
            param="model",
            code="model_not_found",
        )
    config = _upstream_config(gateway, request.model)
    started = time.perf_counter()
    try:
        answer = await upstream_embeddings(config, body)
    except UpstreamError as exc:
        entry.add_call(config, PASSTHROUGH, None, (time.perf_counter() - started) * 1000.0, error=exc.message)
        raise
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
    entry.add_call(config, PASSTHROUGH, usage, (time.perf_counter() - started) * 1000.0)
    return answer


async def create_embeddings(ctx: RequestContext) -> Response:
    gateway, entry = ctx.gateway, ctx.entry
    assert entry is not None  # metered
    entry.record.route, entry.record.reason = PASSTHROUGH, "embeddings"
    embeddings, body = _parse(ctx.body)
    # the embedding model is a model like any other: the policy's pass-through list, the key's models and limits
    name = local_embedding_model(gateway.policy)
    raw = embeddings.input
    # one text or token array, or a list of them
    inputs: list[Any] = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    config = embedding_config(gateway.policy) if embeddings.model == name else _priced_config(gateway, embeddings.model)
    await ctx.admit(embeddings.model, embedded=(config, inputs))  # the inputs' tokens held against budget and TPM
    if embeddings.model == name:
        answer = await _local(gateway, embeddings, name, entry)
    else:
        answer = await _upstream(gateway, embeddings, body, entry)
    return json_response(answer)


def embeddings_route() -> Route:
    return Route("/v1/embeddings", keyed(create_embeddings, metered=True), methods=["POST"])
