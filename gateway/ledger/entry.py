"""One request's ledger entry: its legs, its counterfactual, and exactly one record handed to the ledger."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gateway.ledger.budget import Estimate, InFlight, LegEstimate, Limits
from gateway.ledger.pricing import PriceBook
from gateway.ledger.records import CLIENT_CLOSED, RequestRecord, UpstreamCall
from gateway.ledger.writer import Ledger, Reservation
from policies.routes import LEARNING_ROUTES, LONG, PASSTHROUGH
from policies.schema import ModelConfig


def usage_tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    if not usage:
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def cache_tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    """(prompt tokens read from the provider's prompt cache, prompt tokens written to it), both counted inside
    prompt_tokens. OpenAI reports reads as prompt_tokens_details.cached_tokens; Anthropic (and litellm's
    translation of it) as cache_read_input_tokens and writes as cache_creation_input_tokens."""
    if not usage:
        return 0, 0
    details = usage.get("prompt_tokens_details") or {}
    read = max(int(details.get("cached_tokens") or 0), int(usage.get("cache_read_input_tokens") or 0))
    written = int(usage.get("cache_creation_input_tokens") or 0)
    return read, written


class RequestLedgerEntry:
    """Collects what one request did, then hands one record to the ledger exactly once."""

    def __init__(self, ledger: Ledger, prices: PriceBook, request_id: str, policy: str | None):
        self._ledger = ledger
        self._prices = prices
        self._started = time.perf_counter()
        self._finished = False
        self.flags: list[dict[str, Any]] = []  # security findings, kept in the record's provenance
        self.tags: list[str] = []  # the client's metadata.tags, kept in the provenance (`costs --by tag`)
        self.grounding: dict[str, int] | None = None  # the grounding check's counts, kept in the provenance
        self.record = RequestRecord(
            id=request_id,
            created_at=time.time(),
            key_id=None,
            policy=policy,
            alias=None,
            route=None,
            reason=None,
            status=0,
        )
        self.estimate = Estimate()  # the reservation: an upper bound on what the request may cost
        self._open_legs: list[tuple[ModelConfig, str, float]] = []  # upstream calls started and not yet recorded
        self._reservation: Reservation | None = None  # its in-flight row, handed to the ledger's writer thread

    @property
    def calls(self) -> list[UpstreamCall]:
        """The legs recorded so far."""
        return self.record.calls

    @property
    def cost_usd(self) -> float:
        """What the legs recorded so far cost (once finished: the request's cost)."""
        return sum(c.cost_usd for c in self.record.calls)

    def reserve_soon(self, estimate_of: Callable[[], Estimate], limits: Limits | None = None) -> asyncio.Future[None]:
        """Record the request as in flight with its reservation (estimate_of(), computed on the ledger's writer
        thread); await the future, on the event loop, before the first upstream call. With `limits` it fails with
        budget.BudgetExceeded or TokenLimitExceeded when the key has no room."""

        def prepare() -> tuple[InFlight, Limits | None]:
            self.estimate = estimate_of()
            return InFlight.of(self.record, self.estimate), limits

        self._reservation = self._ledger.reserve_async(prepare)
        return self._reservation.future

    def expect(self, config: ModelConfig, prompt_tokens: int, completion_tokens: int = 0) -> None:
        """What a request with no reservation of its own (a learning request: a shadow long answer) is charged if it
        ends before its usage came (a shutdown cancels it): before, such a leg said "charged at the estimate" and
        cost $0 (probe11: ten shadow legs of ~1,780 prompt tokens at $10/Mtok recorded nothing), so the learning
        loop's daily budget under-counted."""
        cost = self._prices.price(config).cost(prompt_tokens, completion_tokens)
        self.estimate = Estimate((LegEstimate(config.model, prompt_tokens, completion_tokens, cost),))

    def leg_started(self, config: ModelConfig, route: str) -> None:
        """An upstream call is about to start: if the request ends before the call is recorded (the client left,
        a shutdown), the call is charged at its estimate, since the provider bills it all the same."""
        self._open_legs.append((config, route, time.perf_counter()))

    def _close_leg(self, config: ModelConfig, route: str | None) -> None:
        for index, (open_config, open_route, _) in enumerate(self._open_legs):
            if open_config.model == config.model and open_route == route:
                del self._open_legs[index]
                return

    def _charge_estimate(
        self, config: ModelConfig, route: str | None, latency_ms: float, error: str, completion: int | None = None
    ) -> UpstreamCall:
        """A leg the provider may bill but whose usage never arrived: charged at its estimate (with `completion`, the
        estimate's prompt and that many completion tokens)."""
        leg = self.estimate.leg(config.model)
        prompt, bound = (leg.prompt_tokens, leg.completion_tokens) if leg is not None else (0, 0)
        completion = bound if completion is None else completion
        call = self.add_call(
            config, route, {"prompt_tokens": prompt, "completion_tokens": completion}, latency_ms, error
        )
        call.estimated = True
        return call

    def learning_entry(self, request_id: str, route: str, reason: str) -> RequestLedgerEntry:
        """A request of the learning loop (a shadow long answer, a judge) about this one, on the same ledger: its own
        row under `route`, no client key (the operator pays for learning, not the key that asked), linked by its
        provenance."""
        entry = RequestLedgerEntry(self._ledger, self._prices, request_id, self.record.policy)
        entry.record.route, entry.record.reason = route, reason
        entry.record.provenance = {"of": self.record.id}
        return entry

    def add_call(
        self,
        config: ModelConfig,
        route: str | None,
        usage: dict[str, Any] | None,
        latency_ms: float,
        error: str | None = None,
    ) -> UpstreamCall:
        self._close_leg(config, route)
        prompt, completion = usage_tokens(usage)
        cached, written = cache_tokens(usage)
        price = self._prices.price(config)
        cost = price.cost(prompt, completion, cached, written)
        call = UpstreamCall(
            model=config.model,
            route=route,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=cost,
            latency_ms=latency_ms,
            error=error,
            cached_tokens=min(cached, prompt),
            cache_saving_usd=price.cost(prompt, completion) - cost,
            unpriced=not price.known,
            cache_write_tokens=min(written, prompt - min(cached, prompt)),
        )
        self.record.calls.append(call)
        return call

    def stream_ended(
        self,
        config: ModelConfig,
        route: str,
        usage: dict[str, Any] | None,
        latency_ms: float,
        error: str | None,
        status: int,
        relayed: int = 0,
    ) -> UpstreamCall:
        """A streamed leg's end: its usage or, when it ended before the usage event came (the client left, the
        upstream broke or timed out mid-stream), its prompt's estimate and a token for each chunk relayed. A stream
        was charged its whole completion bound when the client left (a 32,768-token completion for one chunk, about
        1,000x a whole answer, held against the key's TPM) and nothing at all when the upstream broke after sending
        (probe11); the provider stops when the stream is closed and bills what it sent."""
        if usage is None and (status == CLIENT_CLOSED or error is not None):
            return self._charge_estimate(
                config,
                route,
                latency_ms,
                f"{error or 'client disconnected'}; no usage reported: charged at the estimate's prompt and the"
                f" {relayed} chunks relayed",
                completion=relayed,
            )
        return self.add_call(config, route, usage, latency_ms, error)

    def counterfactual(
        self,
        long_config: ModelConfig,
        context_tokens: int,
        capacity: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> None:
        """What always-long-context would have cost, stored with the prompt tokens it would have sent.

        When a long leg answered this request, that leg is the counterfactual: the long route never shows
        a saving, and a fallback shows its wasted cheap attempt as a loss. Otherwise it is the context the
        long model could actually receive (at most `capacity`, its window less the answer reserve) at the
        long model's price, plus the answer's completion tokens; `cached_tokens` / `cache_write_tokens` of
        that prompt are priced at the cache rates (the always-long world's prompt cache, estimated by
        gateway.routing.warm_cache).
        """
        calls = self.record.calls
        long_leg = next((c for c in reversed(calls) if c.route == LONG and not c.error), None)
        if long_leg is not None:
            self.record.context_tokens = long_leg.prompt_tokens
            self.record.counterfactual_cost_usd = long_leg.cost_usd
            return
        answered = next((c for c in reversed(calls) if not c.error), None)
        completion = answered.completion_tokens if answered else 0
        tokens = min(context_tokens, capacity)
        self.record.context_tokens = tokens
        self.record.counterfactual_cost_usd = self._prices.price(long_config).cost(
            tokens, completion, cached_tokens, cache_write_tokens
        )

    def finish(self, status: int, error: str | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        now = time.perf_counter()
        for config, route, started in list(self._open_legs):  # cancelled mid-call: the usage will never come
            self._charge_estimate(
                config,
                route,
                (now - started) * 1000.0,
                "the request ended before the upstream answered: charged at the estimate",
            )
        record = self.record
        record.status = status
        record.error = error if error is not None else record.error
        record.latency_ms = (time.perf_counter() - self._started) * 1000.0
        if self.flags:
            record.provenance = {**(record.provenance or {}), "flags": self.flags}
        if self.tags:
            record.provenance = {**(record.provenance or {}), "tags": self.tags}
        if self.grounding is not None:
            record.provenance = {**(record.provenance or {}), "grounding": self.grounding}
        record.prompt_tokens = sum(c.prompt_tokens for c in record.calls)
        record.completion_tokens = sum(c.completion_tokens for c in record.calls)
        record.cost_usd = sum(c.cost_usd for c in record.calls)
        record.cached_tokens = sum(c.cached_tokens for c in record.calls)
        record.cache_saving_usd = sum(c.cache_saving_usd for c in record.calls)
        if record.route in LEARNING_ROUTES:
            # always-long would not have run it: learning's whole cost counts against the saving
            record.counterfactual_cost_usd, record.context_tokens = 0.0, 0
        elif record.route == PASSTHROUGH or (record.counterfactual_cost_usd == 0 and not record.context_tokens):
            # nothing was routed (or routing never got as far as sizing the context): no saving to claim
            record.counterfactual_cost_usd = record.cost_usd
            record.context_tokens = record.context_tokens or record.prompt_tokens
        # never before its in-flight row; the entry lets go of its reservation, whose `prepare` holds the entry: no
        # reference cycle per request for the cyclic collector to find (BENCHMARKS.md section 1, round nine)
        reservation, self._reservation = self._reservation, None
        self._ledger.submit_after(reservation, record)
