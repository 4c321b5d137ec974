"""Answering chat requests: pass-through for plain model names, and for policy aliases plan the route, call
the model, and let the cheap answer be checked (gateway.routing.escalation) before it is trusted.

Self-Route (Li et al., EMNLP 2024): the cheap route answers first from retrieved passages; its answer
(and a direct answer of the cheap model) goes through gateway.routing.escalation, which escalates it to
the long route when the policy's verifier doubts it, or, without a verifier, when it says "unanswerable".

This layer returns `Completed` or `Streamed` values (gateway.routing.calls); the server turns them into HTTP.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio

from gateway import tracing
from gateway.ledger.entry import RequestLedgerEntry
from gateway.protocol import ChatCompletionRequest, completion_text
from gateway.routing import streaming
from gateway.routing.answer_support import take_logprobs, with_logprobs
from gateway.routing.calls import (
    LEG_FAILURES,
    Answer,
    Completed,
    LegFailure,
    Outcome,
    complete_upstream,
    first_answering,
    stream_upstream,
)
from gateway.routing.embedding_model import record_embedded
from gateway.routing.errors import ModelNotFound
from gateway.routing.escalation import CheapAnswer, CheapAnswerCheck, Verdict
from gateway.routing.learning import features_record
from gateway.routing.learning.loop import JudgeInput, LearningLoop, RecordLearning
from gateway.routing.prompt_cache import mark_document_block, needs_cache_control, stable_document_block
from gateway.routing.warm_cache import WarmPrefixes
from gateway.upstreams.base import Upstream
from gateway.upstreams.local import is_packaged_local_model
from pipelines.base import PreparedPrompt
from pipelines.scope import KeyScope
from policies.routes import LONG, PASSTHROUGH, SHADOW
from policies.schema import ModelConfig, Policy

if TYPE_CHECKING:  # the planner loads pyarrow/lancedb/torch: imported by start-up, not with the app
    from gateway.routing.decision import Router
    from gateway.routing.planner import RoutePlan, RoutePlanner


def passthrough_config(policy: Policy, model: str) -> ModelConfig:
    """A model named in the policy keeps its settings (base, key, prices); any other name goes as is,
    except in-process models: a client may only run the packaged one or those the policy names, never
    make the gateway load an arbitrary file from its disk."""
    for config in (policy.cheap, policy.long):
        if config.model == model:
            return config
    if model.startswith("local/") and not is_packaged_local_model(model):
        raise ModelNotFound(f"the model {model!r} does not exist", param="model", code="model_not_found")
    return _plain_config(model)


@functools.lru_cache(maxsize=256)
def _plain_config(model: str) -> ModelConfig:
    """A pass-through name's config with the defaults, built once per name (pydantic's validation was 4-10 us, twice
    a request: the call and its reservation's estimate); nothing changes a ModelConfig once built."""
    return ModelConfig(model=model)


async def prepare(
    planner: RoutePlanner, plan: RoutePlan, route: str, entry: RequestLedgerEntry | None
) -> PreparedPrompt:
    """The prompt for `route` (retrieval and packing), in a worker thread, as a span when tracing is on. New documents
    it began embedding are recorded in `entry` as the embedding model's leg, as planning's are."""
    with tracing.span("selfroute.prepare", **{"selfroute.route": route}):
        started = time.perf_counter()
        prepared, embedded = await anyio.to_thread.run_sync(planner.prepare_counted, plan, route)
        record_embedded(entry, planner.policy, embedded, (time.perf_counter() - started) * 1000.0)
        return prepared


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

    def use_models(self, policy: Policy, router: Router, check: CheapAnswerCheck) -> None:
        """A policy reload's models and thresholds, and its learning settings (gateway.server.startup): requests that
        start from now on use them; one already planning finishes with the ones it started with."""
        planner = self.ready_planner()
        self.policy = policy
        self.check = check
        planner.router = router
        self.learning.use_settings(policy.routing.learning)  # the shadow scale `learn` wrote

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
            started = time.perf_counter()
            plan = await anyio.to_thread.run_sync(planner.plan, chat, body["messages"], header_collection, scope)
            record_embedded(entry, self.policy, plan.embedded_tokens, (time.perf_counter() - started) * 1000.0)
            tracing.set_attributes(
                span, **{"selfroute.route": plan.decision.route, "selfroute.reason": plan.decision.reason}
            )
        decision = plan.decision
        outcome.route, outcome.reason = decision.route, decision.reason
        outcome.rule, outcome.probability = decision.rule, decision.probability
        if self.policy.routing.learning.record_features:
            router = plan.router or planner.router  # the one that decided, even if a reload came meanwhile
            outcome.features = features_record.pre_route(
                decision, router.threshold, plan.block_key, model=router.model_version
            )
        route: str = decision.route  # becomes the escalation's outcome (rag>long) when the answer is not trusted
        prepared = await self.prepare(plan, route, entry)
        checked = self.check.applies(decision, plan.has_document)
        if chat.stream:
            request = streaming.RoutedRequest(chat, body, plan, entry, outcome)
            if self.check.holds(decision, plan.has_document):
                found = await streaming.checked(self, request, prepared, route)
            elif route == LONG:
                found = await streaming.long(self, request, prepared)
            else:
                found = await streaming.plain(self, request, self.policy.cheap, route, prepared)
            outcome.provenance = planner.provenance(plan, found.prepared, found.route)
            return replace(found.streamed, sent=found.prepared.messages)
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
            verdict, judged = await self.verdict(
                plan, prepared, route, cheap_text, outcome, take_logprobs(completion, body), entry.record.key_id
            )
            outcome.reason = verdict.reason(decision)
            if verdict.escalate:
                long_prepared = await self.prepare(plan, LONG, entry)
                outcome.route = verdict.outcome
                try:
                    completion = await self._call_long(body, long_prepared, entry)
                    route, prepared = verdict.outcome, long_prepared
                    self.keep_texts(outcome, long_answer=completion_text(completion))
                    self.learning.judge_escalation(entry, judged, completion_text(completion))
                    judged = None
                except LEG_FAILURES as exc:
                    if self.policy.routing.fallback.on_long_error == "error":
                        raise
                    self.kept_cheap(outcome, exc, route)
        outcome.provenance = planner.provenance(plan, prepared, route)
        self.counterfactual(entry, plan, outcome)
        if outcome.fallback_error is None and judged is not None:
            # the cheap answer stood: maybe answer again on the long route in the background
            self.maybe_shadow(chat, body, plan, entry, judged)
        return Completed(completion, sent=prepared.messages)

    async def prepare(self, plan: RoutePlan, route: str, entry: RequestLedgerEntry) -> PreparedPrompt:
        return await prepare(self.ready_planner(), plan, route, entry)

    def maybe_shadow(
        self,
        chat: ChatCompletionRequest,
        body: dict[str, Any],
        plan: RoutePlan,
        entry: RequestLedgerEntry,
        judged: JudgeInput,
    ) -> None:
        """For routing.learning.shadow_rate of the accepted cheap answers, once the client has its answer: the long
        model answers too (its own ledgered request, route shadow), then the judge compares the two."""
        if not self.learning.wants_shadow(plan.decision.features.get("context_tokens")):
            return
        planner = self.ready_planner()
        shadow_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}

        async def run_long(shadow: RequestLedgerEntry) -> dict[str, Any]:
            long_prepared = await prepare(planner, plan, LONG, shadow)
            # charged if a shutdown cuts it
            shadow.expect(self.policy.long, long_prepared.prompt_tokens, chat.completion_asked or 0)
            return await self._call(self.policy.long, shadow_body, long_prepared, SHADOW, shadow)

        self.learning.shadow(entry, judged, run_long)

    @staticmethod
    def keep_texts(outcome: Outcome, **texts: Any) -> None:
        if outcome.features is not None and "texts" in outcome.features:
            outcome.features["texts"].update(texts)

    @staticmethod
    def kept_cheap(outcome: Outcome, exc: LegFailure, route: str) -> None:
        """The long call failed after a refused cheap answer and the policy says to send the cheap answer:
        the request is recorded as answered by the cheap `route` (the failed legs stay in the ledger; the server
        adds the failure's status to the reason)."""
        outcome.route = route
        outcome.reason = f"{outcome.reason}; {LONG_FAILED}"
        outcome.fallback_error = exc

    async def verdict(
        self,
        plan: RoutePlan,
        prepared: PreparedPrompt,
        route: str,
        text: str | None,
        outcome: Outcome,
        logprobs: list[float] | None = None,
        key: str | None = None,
    ) -> tuple[Verdict, JudgeInput]:
        with tracing.span("selfroute.verify", **{"selfroute.route": route}) as span:
            found = await self._check_answer(plan, prepared, route, text, outcome, logprobs, key)
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
        key: str | None = None,
    ) -> tuple[Verdict, JudgeInput]:
        """The cheap answer's check (gateway.routing.escalation); the verifier's features read the document,
        so they are computed in a worker thread, the literal rule needs no thread hop. The verdict and what it
        read go into the request's learning record; the judge's input (question, passages, answer) comes back."""
        check = self.check  # one check for the verdict and its record, whatever a reload swaps in meanwhile
        if not check.reads_whole_answer:
            answer = CheapAnswer(text, plan.context.question)
            verdict = check.check(plan.decision, answer, key)
        else:

            def verify() -> tuple[Verdict, CheapAnswer]:
                planner = self.ready_planner()
                answer = planner.cheap_answer(plan, prepared, route, text, logprobs)
                # what the long leg would send (a relative threshold charges it against its key's refusal spend)
                long_tokens = min(plan.context_tokens, planner.long.budget_tokens)
                return check.check(plan.decision, answer, key, long_tokens), answer

            verdict, answer = await anyio.to_thread.run_sync(verify)
        if outcome.features is not None:
            features_record.add_verdict(
                outcome.features,
                verdict,
                check.threshold,
                model=check.model_version,
                shadow_chance=self.learning.shadow_chance(plan.decision.features.get("context_tokens")),
            )
            if self.policy.ledger.store_texts:
                features_record.add_texts(outcome.features, answer.query, list(answer.passages), text)
        return verdict, JudgeInput(answer.query or plan.context.question, list(answer.passages), text or "")

    def counterfactual(self, entry: RequestLedgerEntry, plan: RoutePlan, outcome: Outcome) -> None:
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
    def body_for(body: dict[str, Any], config: ModelConfig, prepared: PreparedPrompt) -> dict[str, Any]:
        messages = prepared.messages
        if stable_document_block(prepared.provenance) and needs_cache_control(config):
            messages = mark_document_block(messages)
        return {**body, "model": config.model, "messages": messages}

    def long_models(self) -> list[ModelConfig]:
        return [self.policy.long, *self.policy.long_alternates]

    async def _call(
        self,
        config: ModelConfig,
        body: dict[str, Any],
        prepared: PreparedPrompt,
        route: str,
        entry: RequestLedgerEntry,
    ) -> dict[str, Any]:
        return await complete_upstream(self.upstream, entry, config, route, self.body_for(body, config, prepared))

    async def _call_long(
        self, body: dict[str, Any], prepared: PreparedPrompt, entry: RequestLedgerEntry
    ) -> dict[str, Any]:
        """The long model, then each alternate in order while the failure is the provider's (every try is a leg)."""

        async def attempt(config: ModelConfig) -> dict[str, Any]:
            return await self._call(config, body, prepared, LONG, entry)

        return await first_answering(self.long_models(), attempt)


LONG_FAILED = "the long route failed, answered with the cheap route's reply"
