"""The request surface: what a chat body may carry, and the JSON it must be."""

from __future__ import annotations

import json

import pytest

from gateway import protocol
from gateway.errors import GatewayError
from gateway.protocol import MAX_MODEL_CHARS, OPENAI_PARAMS, parse_chat_request, parse_json_object, rejected_param
from gateway.upstreams.litellm_provider import FORWARDED_PARAMS


def _chat(**extra) -> bytes:
    return json.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


def _error(raw: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_chat_request(raw)
    return caught.value


@pytest.mark.parametrize("depth", [65, 1000, 5000, 100_000])
def test_deep_nesting_is_a_400(depth):
    raw = b'{"model": "m", "messages": [], "x": ' + b"[" * depth + b"]" * depth + b"}"
    error = _error(raw)
    assert (error.status, error.code) == (400, "invalid_json")


def test_nesting_within_the_limit_and_brackets_in_strings_are_fine():
    deep = {"a": [[[[[[[[{"b": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}]]]]]]]]}
    assert parse_json_object(json.dumps(deep).encode()) == deep


def _typed(value):
    """A parsed body with every number's type beside it: 1 and 1.0 compare equal, and must not pass for each other."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": -0, "b": -0.0, "c": 1e5, "d": 1.5e-320, "e": 1e300}',
        b'{"a": 18446744073709551615, "b": -9223372036854775808}',
        b'{"a": 18446744073709551616}',  # past 64 bits: orjson would make it a float
        b'{"a": [{"b": -9223372036854775809}]}',
        b'{"a": 123456789012345678901234567890.5}',
        b'{"a": "\\ud83d\\ude00 \\u00e9", "b": "\xc3\xa9"}',
        '\ufeff{"a": 1}'.encode("utf-8"),
        json.dumps({"a": "x"}).encode("utf-16"),
    ],
)
def test_the_body_is_what_json_reads_whichever_parser_read_it(raw):
    """parse_json_object reads with orjson where it can; every value, and every number's type, is what the json
    module reads (integers past 64 bits stay exact integers)."""
    assert _typed(parse_json_object(raw)) == _typed(json.loads(raw))


@pytest.mark.parametrize("text", ["\\ud800", "abc \\udfff", "\\ud83d x"])
def test_lone_surrogates_are_a_400_naming_the_field(text):
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "' + text.encode() + b'"}]}'
    error = _error(raw)
    assert (error.status, error.code, error.param) == (400, "invalid_unicode", "messages[0].content")


def test_surrogate_bytes_are_a_400_and_pairs_are_fine():
    assert _error(b'{"model": "m", "messages": [], "x": "\xed\xa0\x80"}').code == "invalid_unicode"
    chat, _ = parse_chat_request(_chat(messages=[{"role": "user", "content": "\ud83d\ude00"}]))
    assert chat.messages[0].content == "\U0001f600"


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", -1),
        ("max_tokens", 0),
        ("max_tokens", 2**31),
        ("max_tokens", 2**70),  # past int64: the reservation's row was a 500
        ("max_completion_tokens", -(10**9)),  # a disconnect charged at it gave the key spend back
        ("max_completion_tokens", 2**70),
        ("n", 129),
        ("n", 2**62),  # the reservation's row was a 500
    ],
)
def test_completion_bounds_are_positive_and_bounded(field, value):
    error = _error(_chat(**{field: value}))
    assert (error.status, error.code, error.param) == (400, "invalid_value", field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "10"),  # lax validation reserved 10 and forwarded the string (probe11)
        ("max_tokens", True),
        ("max_tokens", 1e300),
        ("max_tokens", 10.0),
        ("n", "2"),
        ("stream", "yes"),  # was taken for a stream
        ("stream", 1),
        ("temperature", "0.5"),
        ("logprobs", "true"),
        ("stream_options", {"include_usage": "yes"}),
    ],
)
def test_values_are_validated_as_sent_not_coerced(field, value):
    """The body goes upstream as the client sent it, so the gateway must not read it as something else."""
    error = _error(_chat(**{field: value}))
    assert (error.status, error.code) == (400, "invalid_type")
    assert error.param == (field if field != "stream_options" else "stream_options.include_usage")


def test_an_integer_is_a_number():
    chat, body = parse_chat_request(_chat(temperature=1, top_p=1, frequency_penalty=0))
    assert (chat.temperature, body["temperature"]) == (1.0, 1)


def test_completion_bounds_at_their_limits_pass():
    chat, _ = parse_chat_request(_chat(max_tokens=1, max_completion_tokens=2**31 - 1, n=128))
    assert (chat.max_tokens, chat.max_completion_tokens, chat.n) == (1, 2**31 - 1, 128)


@pytest.mark.parametrize(
    "model",
    ["x" * (MAX_MODEL_CHARS + 1), "gpt 4", "a\nb", "gpt-4o\n", "http://h:1/v1", "openai/x://y", "-flag", "m\u00e9"],
)
def test_model_names_are_capped_and_plain(model):
    error = _error(_chat(model=model))
    assert (error.status, error.param) == (400, "model")
    assert len(error.message) < 200


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4o-mini",
        "anthropic/claude-3-5-sonnet-20241022",
        "ollama/llama3:8b",
        "hosted_vllm/meta-llama/Llama-3.1-8B",
        "bedrock/anthropic.claude-v2:1",
        "x" * MAX_MODEL_CHARS,
    ],
)
def test_real_model_names_pass(model):
    chat, _ = parse_chat_request(_chat(model=model))
    assert chat.model == model


@pytest.mark.parametrize(
    "name",
    [
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "custom_llm_provider",
        "mock_response",
        "extra_headers",
        "headers",
        "timeout",
        "num_retries",
        "litellm_logging_obj",
        "aws_region_name",
        "vertex_credentials",
        "azure_ad_token",
    ],
)
def test_connection_parameters_are_rejected_by_name(name):
    error = _error(_chat(**{name: "x"}))
    assert (error.status, error.type, error.param, error.code) == (
        400,
        "invalid_request_error",
        name,
        "unsupported_parameter",
    )


def test_openai_parameters_are_never_rejected_and_litellm_gets_only_them():
    assert not any(rejected_param(name) for name in OPENAI_PARAMS)
    assert set(FORWARDED_PARAMS) <= set(OPENAI_PARAMS) and "model" not in FORWARDED_PARAMS
    assert "metadata" not in FORWARDED_PARAMS  # litellm's own logging options under that name


def test_a_huge_bad_role_is_not_echoed():
    error = _error(_chat(messages=[{"role": "w" * 100_000, "content": "x"}]))
    assert error.status == 400 and len(error.message) < 300


# -- answers: what the gateway reads from and writes into completions and chunks ---------------------------------

OPENING = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}],
    }
).encode()


def test_built_chunks_are_what_the_openai_client_parses():
    """The gateway's own chunks (a truncated stream's close, a trailing selfroute chunk) keep the stream's id, created
    and model, and parse as the official client's chunk type."""
    from openai.types.chat import ChatCompletionChunk

    finish, usage = (
        ChatCompletionChunk.model_validate_json(c)
        for c in protocol.truncated_chunks(OPENING, {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
    )
    assert (finish.id, finish.created, finish.model) == ("chatcmpl-1", 1700000000, "m")
    assert finish.choices[0].finish_reason == "length" and finish.usage is None
    assert usage.choices == [] and usage.usage is not None and usage.usage.total_tokens == 4
    trailing = ChatCompletionChunk.model_validate_json(protocol.chunk_bytes(OPENING, selfroute={"grounding": {}}))
    assert trailing.choices == [] and trailing.model_extra == {"selfroute": {"grounding": {}}}


def test_chunk_reading():
    assert protocol.chunk_text(OPENING) == "Hel"
    assert protocol.chunk_text(b'{"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}') == "(tool call)"
    assert protocol.chunk_text(b'{"choices": []}') == ""  # no content: not even parsed
    assert protocol.chunk_usage(OPENING) is None and protocol.chunk_has_choices(OPENING)
    assert protocol.chunk_usage(b'{"choices": [], "usage": {"prompt_tokens": 2}}') == {"prompt_tokens": 2}
    for broken in (b'{"usage": oops', b'{"usage": {"prompt_tokens": -1}}', b'["usage"]'):
        with pytest.raises(ValueError):
            protocol.chunk_usage(broken)


@pytest.mark.parametrize(
    "body, problem",
    [
        ([], "not an object"),
        ({"choices": []}, "no choices"),
        ({"choices": [{"text": "x"}]}, "without a message"),
        ({"choices": [{"message": {}}], "usage": {"completion_tokens": 1.5}}, "not a token count"),
        ({"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": 1}}, None),
    ],
)
def test_completion_problems(body, problem):
    found = protocol.completion_problem(body)
    assert (found is None) if problem is None else (problem in found)


def test_completion_text():
    assert protocol.completion_text({"choices": [{"message": {"content": "hi"}}]}) == "hi"
    assert protocol.completion_text({"choices": [{"message": {"tool_calls": [{}]}}]}) == "(tool call)"
    assert protocol.completion_text({"choices": []}) is None
