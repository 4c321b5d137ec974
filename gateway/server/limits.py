"""What a key may do before its request is routed: the policy's pass-through allow-list, and a named key's
model allow-list, budget and rate limits; and each request's reservation.

Limits live in the ledger database, so every worker of one host that shares it enforces the same ones:
requests per minute are counted in rate_windows at admission (an atomic upsert); spend and tokens per minute
are reserved before the first upstream call (gateway/ledger/budget.py: the request's estimated cost and tokens
against what the ledger recorded and what requests in flight reserved, in one transaction). Replicas with their
own databases each enforce the limits on their own share of the traffic.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

import anyio

from gateway.errors import GatewayError
from gateway.ledger.budget import BudgetExceeded, Estimate, LegEstimate, Limits, TokenLimitExceeded
from gateway.ledger.entry import RequestLedgerEntry
from gateway.ledger.keys import KeyStore, NamedKey
from gateway.ledger.pricing import PriceBook
from gateway.protocol import ChatCompletionRequest
from gateway.routing.embedding_model import embedding_config
from gateway.routing.service import passthrough_config
from gateway.server import headers
from gateway.server.auth import Caller
from pipelines.cache import LockedLRU
from pipelines.scope import KeyScope
from pipelines.tokens import count_tokens
from policies.limits import model_info
from policies.passthrough import passthrough_allowed
from policies.schema import ModelConfig, Policy

TPM_WINDOW_S = 60.0
# a request body past this size has its reservation's estimate counted in a worker thread, not the ledger's
WRITER_COUNT_BYTES = 32_768
# a completion's bound when neither the request (max_tokens) nor the model's known limits give one
DEFAULT_COMPLETION_BOUND = 4096
# the routed prompts' windows when the policy gives none (policies/limits.py assumes these for made-up names)
DEFAULT_WINDOWS = {"cheap": 8192, "long": 128_000}
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators per message, as OpenAI counts them


def model_allowed(patterns: tuple[str, ...] | list[str] | None, model: str) -> bool:
    return patterns is None or any(fnmatchcase(model, pattern) for pattern in patterns)


def _not_allowed(model: str) -> GatewayError:
    return GatewayError(403, f"this key may not use the model {model[:256]!r}", param="model", code="model_not_allowed")


def model_usable(policy: Policy, caller: Caller, model: str) -> bool:
    """A routed alias, or a pass-through model the policy allows (policies.passthrough); and one the caller's key
    may use."""
    if not passthrough_allowed(policy, model):
        # the gateway's own embedding model counts as the policy's; named only here, off the common path
        from gateway.routing.embedding_model import local_embedding_model

        if model != local_embedding_model(policy):
            return False
    return caller.key is None or model_allowed(caller.key.models, model)


def check_model(policy: Policy, caller: Caller, model: str) -> None:
    """403 model_not_allowed for a pass-through model the policy does not allow, or a model the key may not use."""
    if not model_usable(policy, caller, model):
        raise _not_allowed(model)


def _retry_after(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, math.ceil(seconds)))}


def reset_text(seconds: float) -> str:
    """A window's reset as OpenAI writes it: 250ms, 17s, 1m0s."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    return f"{whole // 60}m{whole % 60}s" if whole >= 60 else f"{whole}s"


@dataclass(frozen=True)
class RateLimits:
    """A named key's request and token windows as its response tells them (OpenAI's x-ratelimit-* headers):
    (limit, remaining, seconds until the window resets) each, None for a limit the key does not have."""

    requests: tuple[int, int, float] | None = None
    tokens: tuple[int, int, float] | None = None

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for state, names in (
            (
                self.requests,
                (
                    headers.RATELIMIT_LIMIT_REQUESTS,
                    headers.RATELIMIT_REMAINING_REQUESTS,
                    headers.RATELIMIT_RESET_REQUESTS,
                ),
            ),
            (
                self.tokens,
                (headers.RATELIMIT_LIMIT_TOKENS, headers.RATELIMIT_REMAINING_TOKENS, headers.RATELIMIT_RESET_TOKENS),
            ),
        ):
            if state is not None:
                limit, remaining, reset = state
                out[names[0]], out[names[1]], out[names[2]] = str(limit), str(max(0, remaining)), reset_text(reset)
        return out


def _check_usage(keys: KeyStore, key: NamedKey, now: float) -> RateLimits:
    """Requests per minute, counted in the ledger database (runs in a worker thread); the tokens the ledger has
    recorded in the key's TPM window, for its headers. Budget and TPM are held by the request's reservation
    (`reserve`)."""
    tokens = None
    if key.tpm is not None:
        used, oldest = keys.tokens_since(key.name, now - TPM_WINDOW_S)
        tokens = (key.tpm, key.tpm - used, max(0.0, oldest + TPM_WINDOW_S - now) if used else TPM_WINDOW_S)
    if key.rpm is None:
        return RateLimits(tokens=tokens)
    count, until_next = keys.count_request(key.name, now)
    if count > key.rpm:
        keys.uncount_request(key.name, now)
        limits = RateLimits((key.rpm, 0, until_next), tokens)
        raise GatewayError(
            429,
            f"this key's limit of {key.rpm} requests per minute is reached",
            code="rate_limit_exceeded",
            headers={**_retry_after(until_next), **limits.headers()},
        )
    return RateLimits((key.rpm, key.rpm - count, until_next), tokens)


async def admit(policy: Policy, keys: KeyStore, caller: Caller, model: str | None) -> RateLimits | None:
    """Raise the 403 or 429 this request deserves, or return to let it through, with the key's rate-limit state
    (None for a key without request or token limits). `model` None: work on the gateway's own embedding model
    (adding documents), limited by the key's budget and rates only."""
    if model is not None:
        check_model(policy, caller, model)
    key = caller.key
    if key is not None and (key.rpm is not None or key.tpm is not None):
        return await anyio.to_thread.run_sync(_check_usage, keys, key, time.time())
    return None


def _text_tokens(value) -> int:
    """Tokens of the text in a message's content (strings and text parts; images and audio are not text)."""
    if isinstance(value, str):
        return count_tokens(value)
    if isinstance(value, list):
        return sum(_text_tokens(part) for part in value)
    if isinstance(value, dict):
        return sum(_text_tokens(v) for k, v in value.items() if k in ("text", "content", "arguments", "name"))
    return 0


def prompt_tokens(chat: ChatCompletionRequest) -> int:
    """The prompt's tokens as sent: every message's text, tool calls and the tool definitions."""
    total = 3
    for message in chat.messages:
        total += MESSAGE_OVERHEAD_TOKENS + _text_tokens(message.model_dump(exclude_none=True).get("content"))
        for calls in (message.tool_calls, [message.function_call] if message.function_call else None):
            total += sum(_text_tokens(call.get("function", call)) for call in calls or [])
    for tools in (chat.tools, chat.functions):
        if tools:
            total += count_tokens(json.dumps(tools))
    return total


def token_limits(config: ModelConfig) -> tuple[int | None, int | None]:
    """(prompt window, most completion tokens per call) of a model: the policy's (filled in from litellm's model
    information at start-up, policies/limits.py), else litellm's entry for a pass-through name; None if unknown."""
    entry = model_info(config.model) or {}

    def whole(value) -> int | None:
        return int(value) if isinstance(value, (int, float)) and value > 0 else None

    window = config.context_window or whole(entry.get("max_input_tokens")) or whole(entry.get("max_tokens"))
    return window, config.max_output_tokens or whole(entry.get("max_output_tokens"))


def capped_tokens(text: str, cap: int) -> int:
    """The tokens of `text`, or at least `cap` of them: a text whose first 8 x cap characters already hold `cap`
    tokens is not counted further (a long attached document costs a bounded count, not a second full pass)."""
    head = text[: 8 * cap]
    counted = count_tokens(head)
    if counted >= cap or len(head) == len(text):
        return counted
    return count_tokens(text)


# A document past this many characters has its count kept, by key and content digest: the same contract asked
# about again is hashed (~1 ms per 500 kB), not tokenised again (~100 ms). Kept per key (as injection scans are)
# so that no key can learn from the time of its reservation whether another key sent a document.
COUNTED_CHARS = 16_384
_counts: LockedLRU[tuple[KeyScope, bytes, int], int] = LockedLRU(1024)


def document_tokens(text: str, cap: int, scope: KeyScope) -> int:
    """capped_tokens(text, cap), kept for long documents (COUNTED_CHARS) per key."""
    if len(text) < COUNTED_CHARS:
        return capped_tokens(text, cap)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return _counts.get_or_make((scope, digest, cap), lambda: capped_tokens(text, cap))


def _leg(prices: PriceBook, config: ModelConfig, prompt: int, chat: ChatCompletionRequest) -> LegEstimate:
    _, output_limit = token_limits(config)
    completion = (chat.completion_asked or output_limit or DEFAULT_COMPLETION_BOUND) * max(chat.n or 1, 1)
    return LegEstimate(config.model, prompt, completion, prices.price(config).cost(prompt, completion))


def estimate_chat(policy: Policy, prices: PriceBook, chat: ChatCompletionRequest, scope: KeyScope) -> Estimate:
    """An upper bound on what a chat request can cost: a pass-through call of its prompt; for a routed alias the
    cheap leg and the dearest long leg (a rag>long request makes both; a long alternate is called only when the
    long model failed, unbilled), each prompt the context (messages and attached documents; a named collection's
    size is not known here, so the model's window) capped at the model's window, each completion at max_tokens,
    else the model's output limit."""
    prompt = prompt_tokens(chat)
    if chat.model not in policy.aliases:
        return Estimate((_leg(prices, passthrough_config(policy, chat.model), prompt, chat),))
    options = chat.selfroute
    unknown = options is not None and options.collection is not None
    configs = (policy.cheap, policy.long, *policy.long_alternates)
    cap = max(token_limits(c)[0] or DEFAULT_WINDOWS["long"] for c in configs)
    # as far as the widest window (past it every leg's prompt is its window anyway) or what the gateway may embed of
    # them, whichever is more
    counted = max(cap, policy.rag.max_attached_tokens)
    attached = (options.documents or []) if options is not None and not unknown else []
    documents = 0
    for document in attached:
        if documents >= counted:
            break
        documents += document_tokens(document.text, counted - documents, scope) + MESSAGE_OVERHEAD_TOKENS

    def leg(config: ModelConfig, default_window: int) -> LegEstimate:
        window = token_limits(config)[0] or default_window
        return _leg(prices, config, window if unknown else min(prompt + documents, window), chat)

    cheap = leg(policy.cheap, DEFAULT_WINDOWS["cheap"])
    longs = [leg(config, DEFAULT_WINDOWS["long"]) for config in (policy.long, *policy.long_alternates)]
    dearest = max(longs, key=lambda item: item.cost_usd)
    legs: tuple[LegEstimate, ...] = (cheap, dearest)
    if not unknown:
        # the gateway's own embedding of the attached documents, or of the conversation, should the store not hold
        # them yet (planning's retrieval pass, a rag prompt, the long prompt's unit scores): $0, but tokens in the
        # key's TPM window that concurrent requests passed unreserved (round eight); the finished row records what
        # was embedded, if anything, and so gives back the rest
        config = embedding_config(policy)
        tokens = min(documents if attached else prompt, policy.rag.max_attached_tokens)
        legs = (*legs, LegEstimate(config.model, tokens, 0, prices.price(config).cost(tokens, 0)))
    return Estimate(legs, tuple(item for item in longs if item is not dearest))


Embedded = tuple[ModelConfig, Sequence[str | list[int]]]  # an embedding model and the inputs it will read


def estimate_embedded(prices: PriceBook, embedded: Embedded) -> Estimate:
    """An embedding request or documents to add: one leg over its inputs' tokens (a token array counts its length),
    no completion. Without it a burst of them reserved nothing and all passed a key's TPM at once."""
    config, inputs = embedded
    tokens = sum(count_tokens(item) if isinstance(item, str) else len(item) for item in inputs)
    return Estimate((LegEstimate(config.model, tokens, 0, prices.price(config).cost(tokens, 0)),))


async def reserve(
    policy: Policy,
    prices: PriceBook,
    entry: RequestLedgerEntry,
    caller: Caller,
    chat: ChatCompletionRequest | None = None,
    embedded: Embedded | None = None,
    body_bytes: int = 0,
) -> None:
    """Record the request in flight with its reservation before any upstream call: the key's budget and TPM hold
    it atomically in the ledger database (429 when there is no room), and a request that ends without usage (the
    client left) is charged at it."""
    key = caller.key
    limits = Limits(key.budget_usd, key.tpm, key.period_start()) if key is not None else None

    def estimate() -> Estimate:
        if chat is not None:
            return estimate_chat(policy, prices, chat, KeyScope(caller.key_id))
        return estimate_embedded(prices, embedded) if embedded is not None else Estimate()

    estimate_of = estimate
    if body_bytes > WRITER_COUNT_BYTES:
        # counted in a worker thread first: on the ledger's one writer thread, which every request's reservation
        # waits on, 30 routed requests with a 479 kB document kept it in tiktoken 71-75% of the time and other
        # keys' pass-through requests waited seconds behind them (probe10)
        computed = await anyio.to_thread.run_sync(estimate)
        estimate_of = lambda: computed  # noqa: E731
    try:
        # a small request's estimate is counted on the ledger's writer thread: no thread hop of its own, and
        # concurrent requests' rows share a commit (Ledger.reserve_soon)
        await entry.reserve_soon(estimate_of, limits)
    except BudgetExceeded as exc:
        start = key.period_start() if key is not None else None
        # a budget per period comes back when the period ends: say when (no Retry-After for a budget for life)
        until = (
            {}
            if start is None or key is None or key.budget_period_s is None
            else (_retry_after(start + key.budget_period_s - time.time()))
        )
        raise GatewayError(429, exc.message, code="budget_exceeded", headers=until) from None
    except TokenLimitExceeded as exc:
        window = RateLimits(tokens=(key.tpm, 0, exc.retry_after)) if key is not None and key.tpm else RateLimits()
        raise GatewayError(
            429, exc.message, code="rate_limit_exceeded", headers={**_retry_after(exc.retry_after), **window.headers()}
        ) from None
