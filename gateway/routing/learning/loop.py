"""The learning loop of one gateway process: judge escalations, run shadow long answers, ledger both.

Everything here runs in background tasks started after the client's answer is complete, so it never delays or
changes that answer; a failure (the judge's or the shadow's upstream, a malformed verdict) is logged and ledgered
and never reaches the client. Shadow and judge calls are ledgered as their own requests (routes `shadow` and
`judge`, no client key), costed, and capped together by routing.learning.daily_budget_usd per UTC day. At shutdown
`aclose` waits for the work in flight, then cancels what is left; a cancelled request is ledgered as such (503).
Each job returns what it came to (a `LearningOutcome`) and the server records it in the job's ledger entry
(gateway.server.learning), as it records a client request's `Outcome`: routing never writes ledger fields itself.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError
from gateway.ledger.records import LABEL_JUDGE, LABEL_SHADOW, LabelRecord
from gateway.protocol import completion_text
from gateway.routing.calls import complete_upstream
from gateway.routing.errors import RoutingError
from gateway.routing.learning.judge import judge_body, parse_verdict, verdict_good
from gateway.upstreams.errors import UpstreamError
from pipelines.cancellation import detached_context
from policies.routes import JUDGE, LONG, SHADOW

if TYPE_CHECKING:
    from gateway.ledger.entry import RequestLedgerEntry
    from gateway.upstreams.base import Upstream
    from policies.schema import LearningSettings, ModelConfig, Policy, ShadowBackoff

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 10.0  # how long a shutdown waits for shadow and judge work before cancelling it
BUDGET_REFRESH_S = 60.0  # how often the day's learning spend is read again from the (maybe shared) ledger
SHUTDOWN_ERROR = "the gateway shut down before this learning request finished"


def shadow_probability(settings: LearningSettings, context_tokens: float | None) -> float:
    """The chance an accepted cheap answer is shadowed: shadow_rate (times shadow_backoff's scale in force), scaled
    down by shadow_reference_tokens / the request's context tokens when it is longer, so a 128k-token document is
    shadowed 1/8 as often as a 16k one and the expected shadow spend per request stays bounded. The live draw, the
    chance recorded with each checked answer (`learn` weighs a shadow label by 1 / it) and the simulation all use
    this."""
    rate, reference = settings.shadow_rate, settings.shadow_reference_tokens
    if settings.shadow_backoff is not None:
        rate *= settings.shadow_backoff.scale
    if reference is None or context_tokens is None or context_tokens <= reference:
        return rate
    return rate * reference / float(context_tokens)


def shadow_scale_after(backoff: ShadowBackoff, won: bool) -> float:
    """The shadow scale after a refit: times `factor` when it lost to the model in force, divided by it when it won,
    within [min_scale, 1]. `selfroute learn` writes it into the policy after each refit (the gateway's reload puts it
    in force for the draw, shadow_probability); the simulation calls it at each of its refits."""
    scale = backoff.scale / backoff.factor if won else backoff.scale * backoff.factor
    return min(1.0, max(backoff.min_scale, scale))


def learning_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


@dataclass
class LearningOutcome:
    """What one shadow or judge request came to. The server records it in that request's ledger entry and
    finishes the entry (gateway.server.learning.record_learning)."""

    status: int | None  # None: it failed with `failure`, whose status the server's error table gives
    error: str | None = None
    note: str | None = None  # added to the request's reason: the verdict, or why there is no label
    provenance: dict[str, Any] = field(default_factory=dict)  # added to the request's provenance
    label: LabelRecord | None = None  # the label this request produced (a judge's verdict on another request)
    failure: Exception | None = None  # an upstream's (or the gateway's) error that ended it


# record(entry, outcome): the server's recording of a learning request's outcome in its ledger entry (finishes it)
RecordLearning = Callable[["RequestLedgerEntry", LearningOutcome], None]


@dataclass(frozen=True)
class JudgeInput:
    question: str
    passages: Sequence[str]
    cheap_answer: str


def job_estimate(parent: RequestLedgerEntry) -> float:
    """What a shadow or judge of this request may cost, before it runs: what its long answer cost or would have cost
    (the request's counterfactual; a shadow is that long leg again, a judge reads less than it)."""
    legs = [c.cost_usd for c in parent.record.calls if c.route == LONG and not c.error]
    return max([parent.record.counterfactual_cost_usd, *legs])


class DailyBudget:
    """The learning spend of the current UTC day: the ledger's figure (all replicas), re-read every minute, plus
    what this process spent since, plus the jobs in flight (begin..end), each at the larger of its own estimate and the
    dearest job's cost so far: a job's cost is known only when it ends, and answers arriving meanwhile must not each
    start one on the same spend. A job with no estimate, before any job has ended: one at a time. The check is made
    before a job starts, so a day can end about one job over."""

    def __init__(self, limit_usd: float, read_spend: Callable[[float], float] | None):
        self.limit = limit_usd
        self.read_spend = read_spend
        self._lock = threading.Lock()
        self._day = -1
        self._ledger = 0.0
        self._local = 0.0
        self._read_at = 0.0
        self._jobs: dict[int, float | None] = {}  # in flight: its token -> its estimate (None: none)
        self._next_job = 0
        self._dearest: float | None = None  # the most one job (a judge, or a shadow and its judge) cost here

    def _refresh(self, now: float) -> None:
        day = int(now // 86400)
        if day != self._day:
            self._day, self._ledger, self._local, self._read_at = day, 0.0, 0.0, 0.0
        if self.read_spend is not None and now - self._read_at >= BUDGET_REFRESH_S:
            try:
                self._ledger = self.read_spend(day * 86400.0)
                self._local = 0.0
            except Exception:  # an unreachable ledger: keep counting locally
                logger.warning("could not read the day's learning spend from the ledger", exc_info=True)
            self._read_at = now

    def spent(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        with self._lock:
            self._refresh(now)
            return self._ledger + self._local

    def allows(self) -> bool:
        spent = self.spent()
        with self._lock:
            pending = 0.0
            for estimate in self._jobs.values():
                if estimate is None and self._dearest is None:
                    return False
                pending += max(estimate or 0.0, self._dearest or 0.0)
            return spent + pending < self.limit

    def begin(self, estimate_usd: float | None = None) -> int:
        """A job starts (after `allows`): it counts as in flight until `end` with the token this returns."""
        with self._lock:
            self._next_job += 1
            self._jobs[self._next_job] = estimate_usd
            return self._next_job

    def end(self, job: int, cost_usd: float) -> None:
        """A job ended, having cost `cost_usd` (which it added itself)."""
        with self._lock:
            self._jobs.pop(job, None)
            self._dearest = max(self._dearest or 0.0, cost_usd)

    def add(self, usd: float) -> None:
        with self._lock:
            self._local += usd


class LearningLoop:
    def __init__(
        self,
        policy: Policy,
        upstream: Upstream,
        record: RecordLearning,
        read_spend: Callable[[float], float] | None = None,
        seed: int | None = None,
    ):
        self.policy = policy
        self.settings = policy.routing.learning
        self.upstream = upstream
        self.record = record
        self.budget = DailyBudget(self.settings.daily_budget_usd, read_spend)
        self._rng = random.Random(seed)
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self.shutdown_grace_s = SHUTDOWN_GRACE_S

    @property
    def judge_model(self) -> ModelConfig:
        return self.settings.judge_model or self.policy.long

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def _spawn(self, work: Coroutine[Any, Any, float], parent: RequestLedgerEntry) -> None:
        # right after the check, with no await between: no other answer checks meanwhile
        job = self.budget.begin(job_estimate(parent))
        # outside the request's cancel scope: the client leaving (after its answer) stops the request's threads, not
        # this work, which it would have cut short (an ingestion it waits for given up) and ledgered as a failure
        task = asyncio.get_running_loop().create_task(self._job(work, job), context=detached_context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _job(self, work: Coroutine[Any, Any, float], job: int) -> None:
        cost = 0.0
        try:
            cost = await work
        finally:
            self.budget.end(job, cost)

    def wants_judge(self) -> bool:
        return self.settings.judge and not self._closing and self.budget.allows()

    def use_settings(self, settings: LearningSettings) -> None:
        """A policy reload's learning settings (its shadow_backoff scale, which `selfroute learn` writes): answers
        checked from now on are drawn with them; the day's budget goes on."""
        self.settings = settings

    def shadow_chance(self, context_tokens: float | None) -> float | None:
        """The chance an accepted cheap answer with this context is shadowed now (shadow_probability), recorded with
        the checked answer so `learn` weighs its label by what was in force; None when shadows are off."""
        if self.settings.shadow_rate <= 0:
            return None
        return shadow_probability(self.settings, context_tokens)

    def wants_shadow(self, context_tokens: float | None = None) -> bool:
        """Drawn once per accepted cheap answer: run the long route too, with probability shadow_rate (times the
        shadow_backoff scale in force; less for a context over shadow_reference_tokens: shadow_probability)."""
        rate = shadow_probability(self.settings, context_tokens)
        return rate > 0 and not self._closing and self._rng.random() < rate and self.wants_judge()

    def judge_escalation(self, parent: RequestLedgerEntry, given: JudgeInput, long_answer: str | None) -> None:
        """Both answers exist (the cheap one was escalated): judge them in the background."""
        if long_answer is None or not self.wants_judge():
            return
        self._spawn(self._judge(parent, given, long_answer, LABEL_JUDGE, 0.0), parent)

    def shadow(
        self,
        parent: RequestLedgerEntry,
        given: JudgeInput,
        run_long: Callable[[RequestLedgerEntry], Awaitable[dict[str, Any]]],
    ) -> None:
        """The client has its (cheap) answer: answer again on the long route in the background, then judge."""
        self._spawn(self._shadow(parent, given, run_long), parent)

    async def _shadow(
        self,
        parent: RequestLedgerEntry,
        given: JudgeInput,
        run_long: Callable[[RequestLedgerEntry], Awaitable[dict[str, Any]]],
    ) -> float:
        """What it cost (its judge's included)."""
        shadow_id = learning_request_id()
        entry = parent.learning_entry(shadow_id, SHADOW, f"shadow long answer of {parent.record.id}")
        try:
            completion = await run_long(entry)
        except asyncio.CancelledError:
            self.record(entry, LearningOutcome(503, SHUTDOWN_ERROR))
            raise
        except (GatewayError, RoutingError, UpstreamError) as exc:  # refused or failed: ledgered, not a 500
            self.record(entry, LearningOutcome(None, exc.message, failure=exc))
            self.budget.add(entry.cost_usd)
            return entry.cost_usd
        except Exception as exc:  # never the client's problem: logged and ledgered
            logger.exception("shadow answer of %s failed", parent.record.id)
            self.record(entry, LearningOutcome(500, f"internal error: {type(exc).__name__}: {exc}"))
            return 0.0
        self.record(entry, LearningOutcome(200))
        self.budget.add(entry.cost_usd)
        return entry.cost_usd + await self._judge(
            parent, given, completion_text(completion), LABEL_SHADOW, entry.cost_usd, shadow_id=shadow_id
        )

    async def _judge(
        self,
        parent: RequestLedgerEntry,
        given: JudgeInput,
        long_answer: str | None,
        source: str,
        extra_cost: float,
        shadow_id: str | None = None,
    ) -> float:
        """What it cost."""
        judge_id = learning_request_id()
        entry = parent.learning_entry(judge_id, JUDGE, f"judge of {parent.record.id} ({source})")
        judged = {"shadow": shadow_id} if shadow_id is not None else {}  # the shadow answer it judged
        config = self.judge_model
        body = judge_body(config.model, given.question, given.passages, given.cheap_answer, long_answer or "")
        try:
            completion = await complete_upstream(self.upstream, entry, config, JUDGE, body)
        except asyncio.CancelledError:
            self.record(entry, LearningOutcome(503, SHUTDOWN_ERROR, provenance=judged))
            raise
        except (GatewayError, RoutingError, UpstreamError) as exc:  # refused or failed: ledgered, not a 500
            self.record(entry, LearningOutcome(None, exc.message, provenance=judged, failure=exc))
            self.budget.add(entry.cost_usd)
            return entry.cost_usd
        except Exception as exc:
            logger.exception("judge of %s failed", parent.record.id)
            self.record(entry, LearningOutcome(500, f"internal error: {type(exc).__name__}: {exc}", provenance=judged))
            return 0.0
        verdict = parse_verdict(completion_text(completion))
        cost = entry.calls[-1].cost_usd if entry.calls else 0.0
        if verdict is None:
            self.record(entry, LearningOutcome(200, note="malformed verdict, no label", provenance=judged))
        else:
            label = LabelRecord(
                request_id=parent.record.id,
                source=source,
                good=verdict_good(verdict),
                verdict=verdict,
                key_id=parent.record.key_id,
                cost_usd=cost + extra_cost,
                label_request_id=judge_id,
            )
            self.record(entry, LearningOutcome(200, note=verdict, provenance=judged, label=label))
        self.budget.add(cost)
        return cost

    async def aclose(self, grace_s: float | None = None) -> None:
        """Start nothing new; wait up to `grace_s` (default shutdown_grace_s) for the work in flight, then cancel the
        rest (each cancelled request is ledgered with a 503 before the ledger closes)."""
        self._closing = True
        if not self._tasks:
            return
        pending = set(self._tasks)
        _, late = await asyncio.wait(pending, timeout=self.shutdown_grace_s if grace_s is None else grace_s)
        for task in late:
            task.cancel()
        if late:
            logger.warning("cancelled %d shadow/judge requests at shutdown (ledgered as 503)", len(late))
            await asyncio.gather(*late, return_exceptions=True)
