"""The OpenAI chat-completions wire format, in one place: the request surface the gateway accepts (pydantic models),
and the answers (chat.completion, chat.completion.chunk, usage: TypedDicts with parse and build helpers) that
upstreams, routing and the server read and write.

Fields follow the order of the OpenAI API reference. Request models allow extra fields: anything a client
sends that we do not model goes to OpenAI-compatible upstreams as a JSON body field, nothing more. What
a client may never send are the provider-connection and test parameters that litellm (or an SDK) would
interpret as client options (`api_base`, `api_key`, `mock_response`, ...): those are a 400 naming the
parameter, so that no request can point the gateway, and the provider key it holds, somewhere else.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any, Literal, TypedDict

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import GatewayError

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    content: str | list[ContentPart] | None = None
    role: Role
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None


class StreamOptions(_Open):
    model_config = ConfigDict(extra="allow", strict=True)  # see ChatCompletionRequest
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


MAX_MODEL_CHARS = 256
MAX_COMPLETION_TOKENS = 2**31 - 1  # OpenAI's integer bound; no model writes more
MAX_CHOICES = 128  # OpenAI's most choices per request (n)
# provider/name[:tag][@version]: letters, digits and . _ - : / @ + ; never a URL (litellm reads some as one)
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+\-]*")  # fullmatch: "$" would let a final newline through

# Parameters that configure the client connection rather than the completion: litellm (and the SDKs) take
# them as call options. A client never chooses where the gateway connects, with which credentials, or
# fakes an answer. Prefixes cover the provider families' credential and endpoint options.
REJECTED_PARAMS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "api_type",
        "organization",
        "project",
        "custom_llm_provider",
        "mock_response",
        "mock_timeout",
        "mock_tool_calls",
        "mock_delay",
        "extra_headers",
        "extra_query",
        "extra_body",
        "headers",
        "timeout",
        "request_timeout",
        "stream_timeout",
        "num_retries",
        "max_retries",
        "retry_policy",
        "fallbacks",
        "context_window_fallback_dict",
        "deployment_id",
        "model_list",
        "client",
        "shared_session",
        "ssl_verify",
        "proxy",
        "proxies",
        "input_cost_per_token",
        "output_cost_per_token",
        "base_model",
        "custom_prompt_dict",
        "model_info",
        "region_name",
        "tenant_id",
        "client_id",
        "client_secret",
        "azure_ad_token",
        "azure_ad_token_provider",
        "api_key_env",
        "caching",
        "cache",
        "callbacks",
        "logger_fn",
        "proxy_server_request",
        "guardrails",
    }
)
REJECTED_PREFIXES = (
    "litellm_",
    "aws_",
    "azure_",
    "vertex_",
    "vertexai_",
    "watsonx_",
    "anthropic_",
    "gemini_",
    "openai_",
    "s3_",
    "gcs_",
    "langfuse_",
    "langsmith_",
    "mock_",
    "input_cost_",
    "output_cost_",
)


def rejected_param(name: str) -> bool:
    return name in REJECTED_PARAMS or name.startswith(REJECTED_PREFIXES)


class ChatCompletionRequest(_Open):
    # strict types: the body goes upstream as sent, so what the gateway validated must be what was sent. Lax
    # validation read "max_tokens": "10" (or true) as 10 for the reservation and forwarded the string, and took
    # "stream": "yes" for a stream (probe11); OpenAI answers these with a 400, and so does the gateway now. An integer
    # still passes where a number is asked for (temperature: 1)
    model_config = ConfigDict(extra="allow", strict=True)
    messages: list[ChatMessage] = Field(min_length=1)
    model: str = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    audio: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    function_call: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    # a positive token count: a negative bound made a negative reservation, and a disconnect charged at it gave the
    # key spend back; past int64 the reservation's row was a 500
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_COMPLETION_TOKENS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_COMPLETION_TOKENS)
    # OpenAI's string values, and LiteLLM's `tags` list (recorded and reported by the gateway, never sent upstream)
    metadata: dict[str, str | list[str]] | None = None
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
    stop: str | list[str] | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    user: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    selfroute: SelfrouteOptions | None = None

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str) -> str:
        if not _MODEL_NAME.fullmatch(value) or "://" in value:
            raise ValueError("a model name is letters, digits and . _ - : / @ + (no spaces, no URL)")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("n must be at least 1")
        if value is not None and value > MAX_CHOICES:  # OpenAI's limit; past int64 the reservation was a 500
            raise ValueError(f"n must be at most {MAX_CHOICES}")
        return value

    @property
    def completion_asked(self) -> int | None:
        """The completion's bound the request sets, or None: the larger of max_tokens and max_completion_tokens, since
        both go upstream as sent and a provider may honour either (probe11: 100000 beside 1 was reserved at 1)."""
        return max(self.max_completion_tokens or 0, self.max_tokens or 0) or None

    @property
    def wants_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


MAX_JSON_DEPTH = 64
# a lone UTF-16 surrogate can only arrive as a \\u escape or as surrogate bytes (json.loads lets them pass)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _may_hold_surrogates(raw: bytes) -> bool:
    # single-byte tests first (memchr: microseconds a megabyte); the regex only for bodies with escapes
    return b"\xed" in raw or (b"\\" in raw and _SURROGATE_ESCAPE.search(raw) is not None)


class _NonFinite(ValueError):
    """A number JSON cannot carry: 1e400 (infinite as a float), or the non-standard Infinity / NaN literals."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text[:40])
    return value


def _no_constant(text: str) -> float:
    raise _NonFinite(text)


# one decoder with the hooks, made once: json.loads with hooks builds a JSONDecoder (and its scanner) per call,
# 1.5 of the 4 us it took to parse a small chat body
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object; anything else is a 400 saying what is wrong.

    Also a 400: nesting deeper than MAX_JSON_DEPTH (the parser and every later walk over the body
    recurse) and strings holding lone surrogates (no upstream, tokenizer or database can encode them).
    """
    if not raw.strip():
        raise GatewayError(400, "request body is empty; expected a JSON object", code="invalid_json")
    fast = _fast_parse(raw)
    if fast is not None:
        return fast
    try:
        # what json.loads does with bytes (the encoding found from the first bytes), then the shared decoder
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except RecursionError:
        raise _too_deep_error() from None
    except _NonFinite as exc:
        raise GatewayError(
            400,
            f"the JSON body holds a number that is not finite ({exc}): JSON has no Infinity or "
            "NaN, and no upstream accepts them",
            code="invalid_value",
        ) from None
    except ValueError as exc:
        raise GatewayError(400, f"could not parse the JSON body: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object", code="invalid_type")
    if _too_deep(body):
        raise _too_deep_error()
    if _may_hold_surrogates(raw):
        for path, text in _strings(body, ""):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise GatewayError(
                    400,
                    f"invalid value for '{path}': the text holds a lone UTF-16 surrogate",
                    param=path or None,
                    code="invalid_unicode",
                ) from None
    return body


# an integer literal orjson reads as a float (it keeps integers only within 64 bits) has at least this magnitude
_INT64_EDGE = 2.0**63


def _fast_parse(raw: bytes) -> dict[str, Any] | None:
    """The body as orjson reads it (a ninth of the json module's time on a chat body), or None for json's path:
    whatever orjson refuses (not UTF-8, lone surrogates, NaN, 1e400, a BOM: json's path says which 400), anything not
    an object, and bodies with an integer past 64 bits, which orjson turns into a float (json keeps it exact).
    orjson never passes a lone surrogate, so these bodies need no surrogate check; the depth is checked on the way
    (as _too_deep does)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(body) is not dict:
        return None
    level: list[Any] = [body]
    depth = 1
    while level:  # level by level: no recursion
        if depth > MAX_JSON_DEPTH:
            raise _too_deep_error()
        depth += 1
        below = []
        for value in level:
            for item in value.values() if type(value) is dict else value:
                kind = type(item)
                if kind is dict or kind is list:
                    below.append(item)
                elif kind is float and not -_INT64_EDGE < item < _INT64_EDGE:
                    return None
        level = below
    return body


def _too_deep_error() -> GatewayError:
    return GatewayError(400, f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep", code="invalid_json")


def _too_deep(body: Any) -> bool:
    """Whether containers nest deeper than MAX_JSON_DEPTH (level by level: the point is not to recurse)."""
    level, depth = [body], 1
    while level:
        if depth > MAX_JSON_DEPTH:
            return True
        below = []
        for value in level:
            for item in value.values() if type(value) is dict else value:
                if type(item) is dict or type(item) is list:
                    below.append(item)
        level, depth = below, depth + 1
    return False


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key, path)
            yield from _strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


def refuse_connection_params(body: dict[str, Any]) -> None:
    """The closed surface: nothing in a request chooses where, or with what, the gateway connects."""
    for name in body:
        if rejected_param(name):
            raise GatewayError(
                400,
                f"unsupported parameter: '{name}' configures the gateway's connection to its "
                "providers and cannot be set by a request",
                param=name,
                code="unsupported_parameter",
            )


def parse_chat_request(raw: bytes) -> tuple[ChatCompletionRequest, dict[str, Any]]:
    """Validate a request body; bad input becomes a 400 that names the offending parameter.

    Returns the validated model and the body exactly as the client sent it: the latter is what
    goes upstream (minus our `selfroute` extension), so unknown fields pass through untouched.
    """
    body = parse_json_object(raw)
    refuse_connection_params(body)
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    body.pop("selfroute", None)
    _take_tags(body)
    return request, body


MAX_TAGS, MAX_TAG_CHARS = 32, 128


def request_tags(request: ChatCompletionRequest) -> list[str]:
    """The request's LiteLLM-style `metadata.tags` (checked by parse_chat_request), in order, without repeats."""
    tags = (request.metadata or {}).get("tags") or []
    return list(dict.fromkeys(tags)) if isinstance(tags, list) else [tags]


def _take_tags(body: dict[str, Any]) -> None:
    """Check `metadata.tags` and keep it from the upstream (OpenAI takes only string metadata values); any other
    metadata value must be a string, as OpenAI requires."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        return
    for name, value in metadata.items():
        if name != "tags" and not isinstance(value, str):
            raise GatewayError(
                400,
                f"metadata.{name[:64]} must be a string (only metadata.tags may be a list)",
                param=f"metadata.{name[:64]}",
                code="invalid_value",
            )
    if "tags" not in metadata:
        return
    tags = metadata["tags"]
    tags = [tags] if isinstance(tags, str) else tags
    if len(tags) > MAX_TAGS or not all(0 < len(t) <= MAX_TAG_CHARS for t in tags):
        raise GatewayError(
            400,
            f"metadata.tags: at most {MAX_TAGS} tags of 1-{MAX_TAG_CHARS} characters",
            param="metadata.tags",
            code="invalid_value",
        )
    rest = {k: v for k, v in metadata.items() if k != "tags"}
    if rest:
        body["metadata"] = rest
    else:
        body.pop("metadata")


# What a request may carry to any upstream: the documented OpenAI chat-completion parameters. Paths that
# pass parameters as call options (litellm) forward only these; `metadata` stays behind there because
# litellm reads it as its own logging options.
OPENAI_PARAMS = tuple(name for name in ChatCompletionRequest.model_fields if name != "selfroute")


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
        message = f"invalid value for '{param}': {repr(err['input'])[:64]}; expected one of system, developer, user, assistant, tool, function"
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


# -- answers: chat.completion, chat.completion.chunk, usage -------------------------------------------------------
# Plain TypedDicts and parse/build helpers over bytes and dicts, no pydantic: answers pass through the gateway as the
# upstream sent them (bytes in, bytes out on the pass-through path), so the helpers read only what the gateway needs
# and never validate or rebuild a chunk they only relay. Parsers raise ValueError on a malformed answer; the upstream
# layer turns it into its error (gateway.upstreams.base.malformed_answer / malformed_chunk).


class Usage(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, Any]  # cached_tokens: read from the provider's prompt cache


class AnswerMessage(TypedDict, total=False):
    role: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    function_call: dict[str, Any]


class Choice(TypedDict, total=False):
    index: int
    message: AnswerMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletion(TypedDict, total=False):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    selfroute: dict[str, Any]  # the gateway's own object: route, provenance, cost, legs, grounding


class Delta(TypedDict, total=False):
    role: str
    content: str | None
    tool_calls: list[dict[str, Any]]


class ChunkChoice(TypedDict, total=False):
    index: int
    delta: Delta
    finish_reason: str | None


class ChatCompletionChunk(TypedDict, total=False):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage
    selfroute: dict[str, Any]  # the gateway's trailing chunks: cost and legs (usage chunk), grounding


USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
TOOL_CALL_TEXT = "(tool call)"  # a tool call's text for the answer checks: an action, never a refusal


def check_usage(usage: Any) -> dict[str, Any] | None:
    """A usage object (the `Usage` fields, and whatever else the provider reports: its cache counts) whose token counts
    are whole numbers (or absent); ValueError otherwise."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise ValueError(f"usage is a {type(usage).__name__}, not an object")
    for name in USAGE_COUNTS:
        value = usage.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"usage.{name} is {value!r}, not a token count")
    return usage


def completion_problem(data: Any) -> str | None:
    """What keeps `data` from being the chat.completion the gateway relies on (choices with a message object, a
    well-formed usage), or None."""
    if not isinstance(data, dict):
        return f"the body is a JSON {type(data).__name__}, not an object"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices"
    if not all(isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices):
        return "a choice without a message object"
    try:
        check_usage(data.get("usage"))
    except ValueError as exc:
        return str(exc)
    return None


def completion_text(completion: ChatCompletion | dict[str, Any]) -> str | None:
    """The first choice's text ("(tool call)" for a tool call)."""
    choices = completion.get("choices") or []
    if not choices:
        return None
    message = choices[0].get("message") or {}
    if message.get("tool_calls") or message.get("function_call"):
        return TOOL_CALL_TEXT
    return message.get("content")


def chunk_usage(data: bytes) -> dict[str, Any] | None:
    """The usage object of a stream chunk, if it carries one; the substring test avoids parsing most chunks.
    ValueError for a chunk that is not JSON or whose usage is malformed."""
    if b'"usage"' not in data:
        return None
    parsed = json.loads(data)
    if not isinstance(parsed, dict):
        raise ValueError(f"the chunk is a JSON {type(parsed).__name__}, not an object")
    usage = parsed.get("usage")
    return check_usage(usage) if isinstance(usage, dict) else None


def chunk_text(data: bytes) -> str:
    """A stream chunk's text ("(tool call)" for a tool call); the substring test avoids parsing chunks that carry
    none. ValueError (or AttributeError, IndexError) for a malformed chunk."""
    if b'"content"' not in data and b'"tool_calls"' not in data:
        return ""
    choices = json.loads(data).get("choices") or []
    delta = (choices[0].get("delta") or {}) if choices else {}
    if delta.get("tool_calls"):
        return TOOL_CALL_TEXT
    return delta.get("content") or ""


def chunk_has_choices(data: bytes) -> bool:
    """Whether a chunk carries choices (a usage chunk carries none). ValueError for a chunk that is not JSON."""
    return bool(json.loads(data).get("choices"))


def chunk_bytes(
    like: bytes | ChatCompletionChunk | dict[str, Any],
    choices: list[ChunkChoice] | None = None,
    usage: Usage | dict[str, Any] | None = None,
    selfroute: dict[str, Any] | None = None,
) -> bytes:
    """A chat.completion.chunk of the gateway's own, with the id, created and model of `like` (a stream's first
    chunk, as bytes or parsed): no choices unless given, then usage and the selfroute object when given."""
    opening = json.loads(like) if isinstance(like, bytes) else like
    chunk: dict[str, Any] = {
        "id": opening.get("id"),
        "object": "chat.completion.chunk",
        "created": opening.get("created"),
        "model": opening.get("model"),
        "choices": choices or [],
    }
    if usage is not None:
        chunk["usage"] = usage
    if selfroute is not None:
        chunk["selfroute"] = selfroute
    return json.dumps(chunk).encode()


def truncated_chunks(first: bytes, usage: Usage | dict[str, Any]) -> list[bytes]:
    """Closing chunks for a stream cut after its opening: finish_reason "length" (the text is truncated), then the
    usage counted so far."""
    return [
        chunk_bytes(first, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}]),
        chunk_bytes(first, usage=usage),
    ]
