"""Answering chat requests: pass-through for plain model names, and for policy aliases plan the route, call
the model, and let the cheap answer be checked (gateway.routing.escalation) before it is trusted.

Self-Route (Li et al., EMNLP 2024): the cheap route answers first from retrieved passages; its answer
(and a direct answer of the cheap model) goes through gateway.routing.escalation, which escalates it to
the long route when the policy's verifier doubts it, or, without a verifier, when it says "unanswerable".

This layer returns `Completed` or `Streamed` values (gateway.routing.calls); the server turns them into HTTP.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio

from gateway import tracing
from gateway.errors import GatewayError
from gateway.ledger.entry import RequestLedgerEntry
from gateway.protocol import ChatCompletionRequest
from gateway.routing.answer_support import take_logprobs, with_logprobs
from gateway.routing.calls import (
    Answer,
    Completed,
    Outcome,
    Streamed,
    close_stream,
    complete_upstream,
    open_stream,
    stream_upstream,
)
from gateway.routing.escalation import CheapAnswer, CheapAnswerCheck, Verdict
from gateway.routing.learning import features_record
from gateway.routing.learning.loop import JudgeInput, LearningLoop, RecordLearning
from gateway.routing.prompt_cache import mark_document_block, needs_cache_control, stable_document_block
from gateway.routing.warm_cache import WarmPrefixes
from gateway.upstreams.base import Upstream, chunk_usage, malformed_chunk
from gateway.upstreams.local import is_packaged_local_model
from pipelines.base import PreparedPrompt
from pipelines.scope import KeyScope
from pipelines.tokens import count_tokens
from policies.routes import LONG, PASSTHROUGH, SHADOW
from policies.schema import ModelConfig, Policy

if TYPE_CHECKING:  # the planner loads pyarrow/lancedb/torch: imported by start-up, not with the app
    from gateway.routing.planner import RoutePlan, RoutePlanner

logger = logging.getLogger(__name__)


def completion_text(completion: dict[str, Any]) -> str | None:
    choices = completion.get("choices") or []
    if not choices:
        return None
    message = choices[0].get("message") or {}
    if message.get("tool_calls") or message.get("function_call"):
        return "(tool call)"  # a tool call is an action, never a refusal
    return message.get("content")


def _chunk_text(data: bytes) -> str:
    if b'"content"' not in data and b'"tool_calls"' not in data:
        return ""
    try:
        choices = json.loads(data).get("choices") or []
        delta = (choices[0].get("delta") or {}) if choices else {}
    except (ValueError, AttributeError, IndexError) as exc:
        raise malformed_chunk(exc) from None
    if delta.get("tool_calls"):
        return "(tool call)"
    return delta.get("content") or ""


def _text_or_nothing(data: bytes) -> str:
    """A chunk's text for the judge; a malformed chunk is the relay's to report, not the collector's."""
    try:
        return _chunk_text(data)
    except GatewayError:
        return ""


def passthrough_config(policy: Policy, model: str) -> ModelConfig:
    """A model named in the policy keeps its settings (base, key, prices); any other name goes as is,
    except in-process models: a client may only run the packaged one or those the policy names, never
    make the gateway load an arbitrary file from its disk."""
    for config in (policy.cheap, policy.long):
        if config.model == model:
            return config
    if model.startswith("local/") and not is_packaged_local_model(model):
        raise GatewayError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
    return ModelConfig(model=model)


async def prepare(planner: RoutePlanner, plan: RoutePlan, route: str) -> PreparedPrompt:
    """The prompt for `route` (retrieval and packing), in a worker thread, as a span when tracing is on."""
    with tracing.span("selfroute.prepare", **{"selfroute.route": route}):
        return await anyio.to_thread.run_sync(planner.prepare, plan, route)


class RoutingService:
    """Answers chat requests: pass-through, and routed with the planner start-up hands it (gateway.server.startup
    owns loading the models and the document store)."""

    def __init__(self, policy: Policy, upstream: Upstream, record_learning: RecordLearning):
        self.policy = policy
        self.upstream = upstream
        self.planner: RoutePlanner | None = None  # handed over by start-up (gateway.server.startup) once loaded
        self.check = CheapAnswerCheck(policy)  # the literal-refusal rule until start-up loads the verifier
        self.warm = WarmPrefixes()  # long prompt prefixes this process sent recently (provider prompt caching)
        # judge and shadow work, in the background; the server records what each job came to
        self.learning = LearningLoop(policy, upstream, record_learning)

    def attach(self, planner: RoutePlanner, check: CheapAnswerCheck) -> None:
        """What start-up loaded: the planner (document store, pipelines, router) and the answer check."""
        self.check = check
        self.planner = planner

    def ready_planner(self) -> RoutePlanner:
        """The planner; routed work is asked for only once start-up is done (the server checks readiness first)."""
        if self.planner is None:
            raise RuntimeError("routing asked to plan before start-up handed it a planner")
        return self.planner

    # -- pass-through ---------------------------------------------------------------------------
    async def passthrough(
        self, chat: ChatCompletionRequest, body: dict[str, Any], entry: RequestLedgerEntry, outcome: Outcome
    ) -> Answer:
        outcome.route, outcome.reason = PASSTHROUGH, "model is not a routed alias"
        config = passthrough_config(self.policy, chat.model)
        if chat.stream:
            return await stream_upstream(
                self.upstream, entry, config, PASSTHROUGH, body, client_wants_usage=chat.wants_usage_in_stream
            )
        return Completed(await complete_upstream(self.upstream, entry, config, PASSTHROUGH, body))

    # -- routed ---------------------------------------------------------------------------------
    async def route(
        self,
        chat: ChatCompletionRequest,
        body: dict[str, Any],
        entry: RequestLedgerEntry,
        header_collection: str | None,
        scope: KeyScope,
        outcome: Outcome,
    ) -> Answer:
        """The routed answer. What was decided and done goes into `outcome` as it happens (so a request that fails
        midway is recorded with the route it took); the server renders it and records it in the ledger."""
        planner = self.ready_planner()
        with tracing.span("selfroute.plan") as span:  # context, features, retrieval pass, decision
            plan = await anyio.to_thread.run_sync(planner.plan, chat, body["messages"], header_collection, scope)
            tracing.set_attributes(
                span, **{"selfroute.route": plan.decision.route, "selfroute.reason": plan.decision.reason}
            )
        decision = plan.decision
        outcome.route, outcome.reason = decision.route, decision.reason
        outcome.rule, outcome.probability = decision.rule, decision.probability
        if self.policy.routing.learning.record_features:
            outcome.features = features_record.pre_route(decision, planner.router.threshold, plan.block_key)
        route: str = decision.route  # becomes the escalation's outcome (rag>long) when the answer is not trusted
        prepared = await prepare(planner, plan, route)
        checked = self.check.applies(decision, plan.has_document)
        if chat.stream:
            if checked:
                return await self._stream_checked(chat, body, plan, prepared, route, entry, outcome)
            if route == LONG:
                return await self._stream_long(chat, body, plan, prepared, entry, outcome)
            return await self._stream(chat, body, self.policy.cheap, route, plan, prepared, entry, outcome)
        if route == LONG:
            completion = await self._call_long(body, prepared, entry)
        else:
            wanted = checked and self.policy.routing.verifier is not None and self.policy.routing.verifier.logprobs
            completion = await self._call(
                self.policy.cheap, with_logprobs(body, wanted, self.policy.cheap.model), prepared, route, entry
            )
        judged: JudgeInput | None = None
        if checked:
            cheap_text = completion_text(completion)
            verdict, judged = await self._verdict(
                plan, prepared, route, cheap_text, outcome, take_logprobs(completion, body)
            )
            outcome.reason = verdict.reason(decision)
            if verdict.escalate:
                long_prepared = await prepare(planner, plan, LONG)
                outcome.route = verdict.outcome
                try:
                    completion = await self._call_long(body, long_prepared, entry)
                    route, prepared = verdict.outcome, long_prepared
                    self._keep_texts(outcome, long_answer=completion_text(completion))
                    self.learning.judge_escalation(entry, judged, completion_text(completion))
                    judged = None
                except GatewayError as exc:
                    if self.policy.routing.fallback.on_long_error == "error":
                        raise
                    self._kept_cheap(outcome, exc, route)
        outcome.provenance = planner.provenance(plan, prepared, route)
        self._counterfactual(entry, plan, outcome)
        if outcome.fallback_error is None and judged is not None:
            # the cheap answer stood: maybe answer again on the long route in the background
            self._maybe_shadow(body, plan, entry, judged)
        return Completed(completion, sent=prepared.messages)

    def _maybe_shadow(
        self, body: dict[str, Any], plan: RoutePlan, entry: RequestLedgerEntry, judged: JudgeInput
    ) -> None:
        """For routing.learning.shadow_rate of the accepted cheap answers, once the client has its answer: the long
        model answers too (its own ledgered request, route shadow), then the judge compares the two."""
        if not self.learning.wants_shadow():
            return
        planner = self.ready_planner()
        shadow_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}

        async def run_long(shadow: RequestLedgerEntry) -> dict[str, Any]:
            long_prepared = await prepare(planner, plan, LONG)
            return await self._call(self.policy.long, shadow_body, long_prepared, SHADOW, shadow)

        self.learning.shadow(entry, judged, run_long)

    @staticmethod
    def _keep_texts(outcome: Outcome, **texts: Any) -> None:
        if outcome.features is not None and "texts" in outcome.features:
            outcome.features["texts"].update(texts)

    @staticmethod
    def _kept_cheap(outcome: Outcome, exc: GatewayError, route: str) -> None:
        """The long call failed after a refused cheap answer and the policy says to send the cheap answer:
        the request is recorded as answered by the cheap `route` (the failed legs stay in the ledger)."""
        outcome.route = route
        outcome.reason = f"{outcome.reason}; {LONG_FAILED} ({exc.status} {exc.code or exc.type})"
        outcome.fallback_error = exc

    async def _verdict(
        self,
        plan: RoutePlan,
        prepared: PreparedPrompt,
        route: str,
        text: str | None,
        outcome: Outcome,
        logprobs: list[float] | None = None,
    ) -> tuple[Verdict, JudgeInput]:
        with tracing.span("selfroute.verify", **{"selfroute.route": route}) as span:
            found = await self._check_answer(plan, prepared, route, text, outcome, logprobs)
            tracing.set_attributes(span, **{"selfroute.escalate": found[0].escalate})
            return found

    async def _check_answer(
        self,
        plan: RoutePlan,
        prepared: PreparedPrompt,
        route: str,
        text: str | None,
        outcome: Outcome,
        logprobs: list[float] | None = None,
    ) -> tuple[Verdict, JudgeInput]:
        """The cheap answer's check (gateway.routing.escalation); the verifier's features read the document,
        so they are computed in a worker thread, the literal rule needs no thread hop. The verdict and what it
        read go into the request's learning record; the judge's input (question, passages, answer) comes back."""
        if not self.check.reads_whole_answer:
            answer = CheapAnswer(text, plan.context.question)
            verdict = self.check.check(plan.decision, answer)
        else:

            def verify() -> tuple[Verdict, CheapAnswer]:
                answer = self.ready_planner().cheap_answer(plan, prepared, route, text, logprobs)
                return self.check.check(plan.decision, answer), answer

            verdict, answer = await anyio.to_thread.run_sync(verify)
        if outcome.features is not None:
            features_record.add_verdict(outcome.features, verdict, self.check.threshold)
            if self.policy.ledger.store_texts:
                features_record.add_texts(outcome.features, answer.query, list(answer.passages), text)
        return verdict, JudgeInput(answer.query or plan.context.question, list(answer.passages), text or "")

    def _counterfactual(self, entry: RequestLedgerEntry, plan: RoutePlan, outcome: Outcome) -> None:
        """What always-long would have cost, then what this request tells the warm-prefix record."""
        long = self.policy.long
        pipeline = self.ready_planner().long
        # always-long could send at most what fits the long model's window, less the answer reserve; when all of it
        # fits in reading order it sends the same document block for every question on these documents, so the
        # provider's cache holds it when any routed request on them ended within the TTL (a conversation that fits
        # goes as the client wrote it, unmarked: not counted as cacheable)
        capacity = pipeline.budget_tokens
        whole = plan.source != "prompt" and pipeline.settings.placement == "reading" and plan.context_tokens <= capacity
        sent_stable = stable_document_block(outcome.provenance or {})
        key = plan.block_key if whole or sent_stable else None
        cache = self.warm.estimate(
            long, key if whole else None, plan.stats.context_tokens if whole else None, always_long=True
        )
        entry.counterfactual(long, plan.context_tokens, capacity, cache.cached_tokens, cache.write_tokens)
        self.warm.record(long, key, entry.calls, sent_stable)

    @staticmethod
    def _body(body: dict[str, Any], config: ModelConfig, prepared: PreparedPrompt) -> dict[str, Any]:
        messages = prepared.messages
        if stable_document_block(prepared.provenance) and needs_cache_control(config):
            messages = mark_document_block(messages)
        return {**body, "model": config.model, "messages": messages}

    def _long_models(self) -> list[ModelConfig]:
        return [self.policy.long, *self.policy.long_alternates]

    async def _call(
        self,
        config: ModelConfig,
        body: dict[str, Any],
        prepared: PreparedPrompt,
        route: str,
        entry: RequestLedgerEntry,
    ) -> dict[str, Any]:
        return await complete_upstream(self.upstream, entry, config, route, self._body(body, config, prepared))

    async def _call_long(
        self, body: dict[str, Any], prepared: PreparedPrompt, entry: RequestLedgerEntry
    ) -> dict[str, Any]:
        """The long model, then each alternate in order while the failure is the provider's (every try is a leg)."""
        models = self._long_models()
        for index, config in enumerate(models):
            try:
                return await self._call(config, body, prepared, LONG, entry)
            except GatewayError as exc:
                if index == len(models) - 1 or not worth_an_alternate(exc):
                    raise
                logger.warning(
                    "long model %s failed (%s); trying %s", config.model, exc.status, models[index + 1].model
                )
        raise AssertionError("unreachable: the policy always has a long model")

    async def _stream(self, chat, body, config, route, plan: RoutePlan, prepared, entry, outcome: Outcome) -> Streamed:
        outcome.provenance = self.ready_planner().provenance(plan, prepared, route)
        return await stream_upstream(
            self.upstream,
            entry,
            config,
            route,
            self._body(body, config, prepared),
            client_wants_usage=chat.wants_usage_in_stream,
            before_finish=lambda: self._counterfactual(entry, plan, outcome),
        )

    async def _stream_long(self, chat, body, plan: RoutePlan, prepared, entry, outcome: Outcome) -> Streamed:
        """Open the long stream on the long model, else on each alternate in order (only before the first
        chunk: once text has reached the client, a failure ends the stream with an error event)."""
        models = self._long_models()
        for index, config in enumerate(models):
            try:
                return await self._stream(chat, body, config, LONG, plan, prepared, entry, outcome)
            except GatewayError as exc:
                if index == len(models) - 1 or not worth_an_alternate(exc):
                    raise
                logger.warning(
                    "long model %s failed (%s); trying %s", config.model, exc.status, models[index + 1].model
                )
        raise AssertionError("unreachable: the policy always has a long model")

    async def _stream_checked(
        self, chat, body, plan: RoutePlan, prepared, route: str, entry, outcome: Outcome
    ) -> Streamed:
        """Hold the cheap stream until the check can decide: its opening for the literal rule, the whole answer
        for the verifier. Then relay it, or close it and stream the long answer instead."""
        cheap = self.policy.cheap
        started = time.perf_counter()
        entry.leg_started(cheap, route)  # the client leaving while it is held: charged at the estimate
        try:
            first, chunks = await open_stream(self.upstream, cheap, self._body(body, cheap, prepared))
        except GatewayError as exc:
            entry.add_call(cheap, route, None, (time.perf_counter() - started) * 1000, exc.message)
            raise
        held: list[bytes] = []
        text = ""
        usage = None
        ended = False
        data = first
        try:
            while data is not None:
                held.append(data)
                text += _chunk_text(data)
                try:
                    usage = chunk_usage(data) or usage
                except (ValueError, AttributeError) as exc:
                    raise malformed_chunk(exc) from None
                if not self.check.reads_whole_answer and len(" ".join(text.split())) > self.check.detector.head_chars:
                    break  # the opening is settled: later text cannot make it a refusal
                try:
                    data = await chunks.__anext__()
                except StopAsyncIteration:
                    data, ended = None, True
        except GatewayError as exc:  # nothing was sent yet: the client gets a proper status
            entry.add_call(cheap, route, usage, (time.perf_counter() - started) * 1000, exc.message)
            await close_stream(chunks)
            raise
        decision = plan.decision
        verdict, judged = await self._verdict(plan, prepared, route, text, outcome)
        outcome.reason = verdict.reason(decision)
        if not verdict.escalate:
            outcome.provenance = self.ready_planner().provenance(plan, prepared, route)

            async def held_then_rest() -> AsyncIterator[bytes]:
                try:
                    for item in held[1:]:
                        yield item
                    if not ended:
                        async for item in chunks:
                            yield item
                finally:
                    await close_stream(chunks)  # closing this generator must close the upstream stream too

            def finish_cheap(final_usage, error, status) -> None:
                entry.stream_ended(cheap, route, final_usage, (time.perf_counter() - started) * 1000, error, status)
                self._counterfactual(entry, plan, outcome)
                entry.finish(status, error)
                if status == 200 and error is None:  # the client has the whole answer now
                    self._maybe_shadow(body, plan, entry, judged)

            return Streamed(held[0], held_then_rest(), chat.wants_usage_in_stream, finish_cheap)
        # the refusal never reaches the client: close the cheap stream and answer from the long route
        if not ended:
            await close_stream(chunks)
        if usage is None:  # cut short before the upstream reported usage: count what was sent and received
            usage = {"prompt_tokens": prepared.prompt_tokens, "completion_tokens": count_tokens(text)}
        entry.add_call(cheap, route, usage, (time.perf_counter() - started) * 1000)
        outcome.route = verdict.outcome
        long_prepared = await prepare(self.ready_planner(), plan, LONG)
        try:
            return self._judged_stream(
                await self._stream_long(chat, body, plan, long_prepared, entry, outcome), entry, outcome, judged
            )
        except GatewayError as exc:
            if self.policy.routing.fallback.on_long_error == "error":
                raise
            self._kept_cheap(outcome, exc, route)
        # send the held cheap answer after all; a stream cut after its opening is closed as truncated
        outcome.provenance = self.ready_planner().provenance(plan, prepared, route)
        tail = [] if ended else held_tail(held[0], usage)

        async def held_only() -> AsyncIterator[bytes]:
            for item in [*held[1:], *tail]:
                yield item

        def finish_kept(final_usage, error, status) -> None:  # the cheap leg is already recorded
            self._counterfactual(entry, plan, outcome)
            entry.finish(status, error)

        return Streamed(held[0], held_only(), chat.wants_usage_in_stream, finish_kept)

    def _judged_stream(
        self, streamed: Streamed, entry: RequestLedgerEntry, outcome: Outcome, judged: JudgeInput
    ) -> Streamed:
        """An escalated stream whose text is collected as it is relayed, for the judge once it has ended whole."""
        if not self.learning.settings.judge:
            return streamed
        parts = [_text_or_nothing(streamed.first)] if streamed.first else []
        chunks, finish = streamed.chunks, streamed.finish

        async def collected() -> AsyncIterator[bytes]:
            try:
                async for item in chunks:
                    parts.append(_text_or_nothing(item))
                    yield item
            finally:
                await close_stream(chunks)

        def finish_judged(usage, error, status) -> None:
            whole = status == 200 and error is None
            if whole:
                self._keep_texts(outcome, long_answer="".join(parts))
            finish(usage, error, status)
            if whole:
                self.learning.judge_escalation(entry, judged, "".join(parts))

        return Streamed(streamed.first, collected(), streamed.client_wants_usage, finish_judged)


LONG_FAILED = "the long route failed, answered with the cheap route's reply"


def worth_an_alternate(exc: GatewayError) -> bool:
    """Failures of the provider (timeout, rate limit, 5xx), not of the request: another long model may answer."""
    return exc.status in (408, 429, 500, 502, 503, 504)


def held_tail(first: bytes, usage: dict[str, Any]) -> list[bytes]:
    """Closing chunks for a held stream that was cut after its opening: finish_reason "length" (the text is
    truncated) and the usage counted so far."""
    opening = json.loads(first)
    base = {
        "id": opening.get("id"),
        "object": "chat.completion.chunk",
        "created": opening.get("created"),
        "model": opening.get("model"),
    }
    return [
        json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}).encode(),
        json.dumps({**base, "choices": [], "usage": usage}).encode(),
    ]
