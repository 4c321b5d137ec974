"""The OpenAI chat-completions protocol as pydantic models.

Fields follow the order of the OpenAI API reference. Request models allow extra fields: anything
a client sends that we do not model is kept and passed upstream, never dropped.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import GatewayError

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    content: Union[str, list[ContentPart], None] = None
    role: Role
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None


class StreamOptions(_Open):
    include_usage: bool | None = None


class InlineDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    text: str = Field(min_length=1)
    title: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SelfrouteOptions(BaseModel):
    """Our own request extension, sent by clients as extra_body={"selfroute": {...}}."""

    model_config = ConfigDict(extra="forbid")
    collection: str | None = None
    documents: list[InlineDocument] | None = None
    route: Literal["direct", "rag", "long"] | None = Field(None, description="force a route (debugging)")


class ChatCompletionRequest(_Open):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str = Field(min_length=1)
    audio: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    function_call: Union[str, dict[str, Any], None] = None
    functions: list[dict[str, Any]] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None
    n: int | None = None
    parallel_tool_calls: bool | None = None
    prediction: dict[str, Any] | None = None
    presence_penalty: float | None = None
    prompt_cache_key: str | None = None
    reasoning_effort: str | None = None
    response_format: dict[str, Any] | None = None
    safety_identifier: str | None = None
    seed: int | None = None
    service_tier: str | None = None
    stop: Union[str, list[str], None] = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    tools: list[dict[str, Any]] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    user: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    selfroute: SelfrouteOptions | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("n must be at least 1")
        return value

    @property
    def wants_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object; anything else is a 400 saying what is wrong."""
    if not raw.strip():
        raise GatewayError(400, "request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayError(400, f"could not parse the JSON body: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object", code="invalid_type")
    return body


def parse_chat_request(raw: bytes) -> tuple[ChatCompletionRequest, dict[str, Any]]:
    """Validate a request body; bad input becomes a 400 that names the offending parameter.

    Returns the validated model and the body exactly as the client sent it: the latter is what
    goes upstream (minus our `selfroute` extension), so unknown fields pass through untouched.
    """
    body = parse_json_object(raw)
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    body.pop("selfroute", None)
    return request, body


def _validation_error(exc: ValidationError) -> GatewayError:
    err = exc.errors()[0]
    if err["type"] in ("json_invalid", "json_type"):
        return GatewayError(400, f"could not parse the JSON body: {err['msg']}", code="invalid_json")
    loc = err["loc"]
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in ("str", "list[ContentPart]", "function-after[_one_choice(), int]"):
            continue  # union branch names are not part of the parameter path
        else:
            param += ("." if param else "") + str(part)
    if err["type"] == "missing":
        message = f"missing required parameter: '{param}'"
        code = "missing_required_parameter"
    elif err["type"] == "literal_error" and param.endswith("role"):
        message = f"invalid value for '{param}': {err['input']!r}; expected one of system, developer, user, assistant, tool, function"
        code = "invalid_value"
    elif err["type"] == "too_short" and param == "messages":
        message = "'messages' must contain at least one message"
        code = "empty_array"
    elif err["type"] == "model_attributes_type" and not loc:
        message = "the request body must be a JSON object"
        code = "invalid_type"
    else:
        message = f"invalid value for '{param}': {err['msg']}"
        code = "invalid_type" if err["type"].endswith(("_type", "_parsing")) else "invalid_value"
    return GatewayError(400, message, param=param or None, code=code)
