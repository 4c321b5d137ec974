"""A small OpenAI-compatible upstream for tests. Behaviour is chosen by the model name:

- any name: answers "echo: <last user text>" (first 80 chars), usage from word counts;
- a name containing "refuser": answers "unanswerable";
- a name containing "scripted": answers `app.state.scripted` (a test sets it);
- a name containing "judge": answers `app.state.judge_reply` (a test sets it; a grading verdict by default);
- "status-NNN": fails with HTTP NNN and an OpenAI error body;
- "slow": sleeps 5 s before answering (for timeout tests); "sleep-N": sleeps N seconds (work that outlasts a test);
- a name containing "breaks": a stream that sends one chunk, then drops the connection;
- a name containing "garbled": a stream whose second event is not JSON;
- a name containing "dribble": a stream of 40 words, one every 0.25 s;
- a name containing "flaky": every odd-numbered request to it fails with 503;
- a name containing "wait-N": every odd-numbered request to it fails with 429 and `Retry-After: N`;
- "json-stream" / "text-stream" / "empty-stream": a stream request answered with a JSON completion, a
  text/plain 200, or an event stream holding only [DONE];
- "shape-list" / "shape-string" / "shape-no-choices" / "shape-bad-usage": a 200 whose body is a JSON list,
  a JSON string, a completion without choices, or one whose usage.prompt_tokens is "abc".
- a name containing "prefix-cache": OpenAI-style automatic prompt caching: the words a prompt shares at its start
  with an earlier prompt to that model are reported as usage.prompt_tokens_details.cached_tokens;
- any name, content parts marked `cache_control` (Anthropic-style): the words up to the last marked part are
  a cache block, reported as usage.cache_creation_input_tokens the first time and cache_read_input_tokens after
  (inside prompt_tokens, as litellm reports Anthropic's usage).
POST /v1/embeddings answers [characters, words, 1.0] per input text ("status-NNN" fails the same way).
Every request body received is kept in `app.state.received`, with its arrival time (time.monotonic()).
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

MALFORMED = {
    "shape-list": [{"choices": []}],
    "shape-string": "echo",
    "shape-no-choices": {
        "id": "x",
        "object": "chat.completion",
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    },
    "shape-bad-usage": {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": "abc", "completion_tokens": 1, "total_tokens": 1},
    },
}


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def answer_for(body: dict) -> str:
    if "refuser" in body["model"]:
        return "unanswerable"
    last_user = next((m for m in reversed(body["messages"]) if m["role"] == "user"), {"content": ""})
    return "echo: " + _text(last_user["content"])[:80]


def usage_for(body: dict, answer: str) -> dict:
    prompt = sum(len(_text(m.get("content")).split()) for m in body["messages"])
    completion = len(answer.split())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _words(body: dict) -> list[str]:
    return [w for m in body["messages"] for w in _text(m.get("content")).split()]


def cache_usage(state, body: dict) -> dict:
    """What a provider's prompt cache would report for this prompt (see the module docstring)."""
    usage: dict = {}
    block: list[str] = []
    marked: list[str] | None = None
    for m in body["messages"]:
        parts = m.get("content") if isinstance(m.get("content"), list) else [{"text": m.get("content") or ""}]
        for part in parts:
            block += _text([part]).split()
            if isinstance(part, dict) and part.get("cache_control"):
                marked = list(block)
    if marked is not None:
        key = " ".join(marked)
        if key in state.prompt_cache:
            usage["cache_read_input_tokens"] = len(marked)
        else:
            state.prompt_cache.add(key)
            usage["cache_creation_input_tokens"] = len(marked)
    if "prefix-cache" in body["model"]:
        words = _words(body)
        seen = state.prefixes.setdefault(body["model"], [])
        shared = 0
        for earlier in seen:
            n = 0
            while n < min(len(words), len(earlier)) and words[n] == earlier[n]:
                n += 1
            shared = max(shared, n)
        seen.append(words)
        usage["prompt_tokens_details"] = {"cached_tokens": shared}
    return usage


async def completions(request: Request):
    body = await request.json()
    request.app.state.received.append({"body": body, "headers": dict(request.headers), "at": time.monotonic()})
    model = body["model"]
    if "flaky" in model:
        seen = request.app.state.flaky_calls = getattr(request.app.state, "flaky_calls", 0) + 1
        if seen % 2:
            return JSONResponse(
                {"error": {"message": "fake upstream is flaky", "type": "x", "param": None, "code": None}},
                status_code=503,
            )
    if "wait-" in model:
        seen = request.app.state.wait_calls = getattr(request.app.state, "wait_calls", 0) + 1
        if seen % 2:
            return JSONResponse(
                {"error": {"message": "slow down", "type": "x", "param": None, "code": None}},
                status_code=429,
                headers={"retry-after": model.split("wait-")[1].split("-")[0]},
            )
    if model.startswith("shape-"):
        return JSONResponse(MALFORMED[model])
    if model.startswith("status-"):
        status = int(model.split("-")[1])
        return JSONResponse(
            {"error": {"message": f"fake upstream says {status}", "type": "x", "param": None, "code": None}},
            status_code=status,
        )
    if model == "slow":
        await asyncio.sleep(5)
    if model.startswith("sleep-"):
        await asyncio.sleep(float(model.split("-")[1]))
    answer = (
        request.app.state.judge_reply
        if "judge" in model
        else request.app.state.scripted
        if "scripted" in model
        else answer_for(body)
    )
    usage = {**usage_for(body, answer), **cache_usage(request.app.state, body)}
    base = {"id": "chatcmpl-fake", "created": int(time.time()), "model": model, "system_fingerprint": "fp_fake"}
    if body.get("stream") and model == "text-stream":
        return PlainTextResponse("hello, not an event stream")
    if body.get("stream") and model == "empty-stream":
        return StreamingResponse(iter(["data: [DONE]\n\n"]), media_type="text/event-stream")
    if not body.get("stream") or model == "json-stream":
        return JSONResponse(
            {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer, "refusal": None},
                        "logprobs": fake_logprobs(answer) if body.get("logprobs") else None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )

    async def events():
        chunk = {**base, "object": "chat.completion.chunk"}
        yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}, 'finish_reason': None}]})}\n\n"
        if "breaks" in model:
            raise ConnectionAbortedError("fake upstream drops the stream")
        if "garbled" in model:
            yield 'data: {"usage": oops not json\n\n'
        if "dribble" in model:
            for n in range(40):
                await asyncio.sleep(0.25)
                yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {'content': f'w{n} '}, 'finish_reason': None}]})}\n\n"
        for word in answer.split(" "):
            delta = {"content": word + " "}
            yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"
        yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def fake_logprobs(answer: str) -> dict:
    """OpenAI's shape: one entry per token (here a word); a word in capitals is 'unsure' (-3.0), others -0.1."""
    return {
        "content": [
            {"token": w, "logprob": -3.0 if w.isupper() else -0.1, "bytes": None, "top_logprobs": []}
            for w in answer.split()
        ]
    }


async def embeddings(request: Request):
    body = await request.json()
    request.app.state.received.append({"body": body, "headers": dict(request.headers)})
    model = body["model"]
    if model.startswith("status-"):
        status = int(model.split("-")[1])
        return JSONResponse(
            {"error": {"message": f"fake upstream says {status}", "type": "x", "param": None, "code": None}},
            status_code=status,
        )
    texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
    words = sum(len(t.split()) for t in texts)
    return JSONResponse(
        {
            "object": "list",
            "model": model,
            "usage": {"prompt_tokens": words, "total_tokens": words},
            "data": [
                {"object": "embedding", "index": i, "embedding": [float(len(t)), float(len(t.split())), 1.0]}
                for i, t in enumerate(texts)
            ],
        }
    )


def create_fake_upstream() -> Starlette:
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
        ]
    )
    app.state.received = []
    app.state.scripted = ""
    app.state.judge_reply = '{"verdict": "worse"}'
    app.state.prompt_cache = set()  # Anthropic-style cache blocks seen
    app.state.prefixes = {}  # model -> earlier prompts' words (OpenAI-style prefix caching)
    return app
