"""Shadow answers: the long route runs in the background for accepted cheap answers, after the client has its
answer, never delaying it; ledgered as its own request, judged, capped by the day's budget; a shutdown waits for it
or cancels and ledgers it."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.routing.learning.loop import DailyBudget
from tests.support.policies import learning_policy
from tests.support.routed import QUESTION, TRUSTED, ask, manual, rows, settle


def client_latencies(url: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        raw = ask(url, f"{QUESTION} ({i})", documents=[{"text": manual()}])
        out.append(time.perf_counter() - started)
        assert raw.headers["x-selfroute-route"] == "rag"
        assert raw.parse().choices[0].message.content == TRUSTED  # the cheap answer, never changed
    return out


def test_shadow_rate_one_does_not_delay_the_client(upstream, verifier_file, gateway):
    """The long model takes 1.5 s: a shadow run on the request's path would add at least that to every answer."""
    upstream[1].state.scripted = TRUSTED
    upstream[1].state.judge_reply = '{"verdict": "as_good"}'
    url0, app0, server0 = gateway(learning_policy(upstream[0], verifier_file, long="sleep-1.5", shadow_rate=0.0), "r0")
    url1, app1, server1 = gateway(learning_policy(upstream[0], verifier_file, long="sleep-1.5", shadow_rate=1.0), "r1")
    client_latencies(url0, 1), client_latencies(url1, 1)  # warm both (document embedded, caches filled)
    off, on = client_latencies(url0, 5), client_latencies(url1, 5)
    assert statistics.median(on) < statistics.median(off) + 0.5, (off, on)
    settle(app0, server0)
    settle(app1, server1)
    assert {r["route"] for r in rows(app0, "requests")} == {"rag"}
    routes = [r["route"] for r in rows(app1, "requests")]
    assert routes.count("rag") == routes.count("shadow") == routes.count("judge") == 6
    shadows = [r for r in rows(app1, "requests") if r["route"] == "shadow"]
    assert all(r["status"] == 200 and r["key_id"] is None and r["cost_usd"] > 0 for r in shadows)
    assert all(r["counterfactual_cost_usd"] == 0 for r in shadows)
    labels = rows(app1, "labels")
    assert len(labels) == 6 and {(lab["source"], lab["good"]) for lab in labels} == {("shadow", 1)}
    judges = {r["id"]: r for r in rows(app1, "requests") if r["route"] == "judge"}
    for label in labels:  # the label's cost is its shadow's and its judge's
        judge = judges[label["label_request_id"]]
        shadow = next(r for r in shadows if r["id"] == json.loads(judge["provenance"])["shadow"])
        assert json.loads(shadow["provenance"]) == {"of": label["request_id"]}
        assert label["cost_usd"] == pytest.approx(judge["cost_usd"] + shadow["cost_usd"])
    calls = rows(app1, "upstream_calls")
    # and the gateway's own embedding of the new documents (route passthrough, $0) for the rag prompts
    assert {c["route"] for c in calls} == {"passthrough", "rag", "shadow", "judge"}


def test_a_shutdown_waits_for_shadow_work(upstream, verifier_file, gateway):
    upstream[1].state.scripted = TRUSTED
    url, app, server = gateway(learning_policy(upstream[0], verifier_file, long="sleep-1", shadow_rate=1.0))
    ask(url, QUESTION, documents=[{"text": manual()}])
    settle(app, server)  # at once: the shadow is still waiting for the long model
    assert sorted(r["route"] for r in rows(app, "requests")) == ["judge", "rag", "shadow"]
    assert [lab["source"] for lab in rows(app, "labels")] == ["shadow"]


def test_a_shutdown_past_its_grace_cancels_and_ledgers_shadow_work(upstream, verifier_file, gateway):
    upstream[1].state.scripted = TRUSTED
    url, app, server = gateway(learning_policy(upstream[0], verifier_file, long="sleep-30", shadow_rate=1.0))
    app.state.gateway.routing.learning.shutdown_grace_s = 0.5
    ask(url, QUESTION, documents=[{"text": manual()}])
    started = time.perf_counter()
    settle(app, server)
    assert time.perf_counter() - started < 10
    shadow = next(r for r in rows(app, "requests") if r["route"] == "shadow")
    assert shadow["status"] == 503 and "shut down" in shadow["error"]
    assert rows(app, "labels") == []
    # the cut leg is charged its long prompt, which the provider read (probe11: 0 tokens, $0)
    [leg] = [c for c in rows(app, "upstream_calls") if c["request_id"] == shadow["id"]]
    assert leg["prompt_tokens"] > 100 and "charged at the estimate" in leg["error"]
    assert shadow["prompt_tokens"] == leg["prompt_tokens"]


def test_the_daily_budget_stops_shadows(upstream, verifier_file, gateway):
    upstream[1].state.scripted = TRUSTED
    url, app, server = gateway(learning_policy(upstream[0], verifier_file, shadow_rate=1.0, daily_budget_usd=1e-9))
    for i in range(3):
        ask(url, f"{QUESTION} {i}", documents=[{"text": manual()}])
        time.sleep(0.5)  # the first shadow is done and counted before the next answer
    settle(app, server)
    routes = [r["route"] for r in rows(app, "requests")]
    assert routes.count("shadow") == 1 and routes.count("rag") == 3


def test_answers_while_a_shadow_is_in_flight_keep_to_the_daily_budget(upstream, verifier_file, gateway):
    """Every check used to come before any shadow in flight had its cost counted: six answers while the first
    shadow waited for the long model started six more shadows, with a budget that allows one."""
    upstream[1].state.scripted = TRUSTED
    url, app, server = gateway(
        learning_policy(upstream[0], verifier_file, long="sleep-30", shadow_rate=1.0, daily_budget_usd=1e-9)
    )
    app.state.gateway.routing.learning.shutdown_grace_s = 0.5
    ask(url, QUESTION, documents=[{"text": manual()}])  # its shadow waits 30 s for the long model
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda i: ask(url, f"{QUESTION} {i}", documents=[{"text": manual()}]), range(6)))
    settle(app, server)
    routes = [r["route"] for r in rows(app, "requests")]
    assert routes.count("rag") == 7 and routes.count("shadow") == 1  # cancelled at shutdown, ledgered (503)


def test_shadows_in_flight_count_against_the_daily_budget_at_the_dearest_jobs_cost():
    budget = DailyBudget(1.0, None)
    assert budget.allows()
    first = budget.begin()
    assert not budget.allows()  # no estimate and no job's cost known yet: one at a time
    budget.end(first, 0.3)
    assert budget.spent() == 0.0 and budget.allows()  # what a job spent is added by the job itself
    budget.add(0.3)
    jobs = [budget.begin() for _ in range(3)]
    assert not budget.allows()  # 0.3 spent + three jobs in flight at 0.3 each: a fourth could end the day over
    budget.end(jobs[0], 0.2)
    assert budget.allows()  # two in flight: 0.9 at most


def test_jobs_in_flight_count_at_their_estimates_before_any_has_ended():
    budget = DailyBudget(1.0, None)
    jobs = [budget.begin(0.2) for _ in range(4)]
    assert budget.allows()  # 0.8 in flight by the estimates (the long answers' costs): a fifth may start
    jobs.append(budget.begin(0.2))
    assert not budget.allows()  # 1.0: a sixth could end the day over
    budget.end(jobs.pop(), 0.5)
    assert not budget.allows()  # now the dearest job cost 0.5: four in flight count 2.0
    for job in jobs[:3]:
        budget.end(job, 0.1)
    assert budget.allows()  # one in flight at 0.5


def test_the_budget_reads_the_days_spend_from_the_ledger_and_resets_each_day():
    reads = []

    def read(since):
        reads.append(since)
        return 0.75

    budget = DailyBudget(1.0, read)
    day = 20_000 * 86400.0
    assert budget.spent(day + 10) == 0.75 and reads == [day]
    budget.add(0.3)
    assert budget.spent(day + 20) == pytest.approx(1.05)  # local spend counts until the next read
    assert budget.spent(day + 86400 + 1) == 0.75 and reads[-1] == day + 86400  # a new day, read again


def test_a_shadow_that_routing_refuses_is_ledgered_with_the_refusals_status(upstream, verifier_file, gateway):
    """A shadow whose long prompt routing refuses (e.g. no longer fits the window) is its row's 4xx, not a 500."""
    from gateway.routing.errors import RequestTooLarge

    upstream[1].state.scripted = TRUSTED
    url, app, server = gateway(learning_policy(upstream[0], verifier_file, shadow_rate=1.0))
    loop = app.state.gateway.routing.learning
    shadow = loop.shadow

    async def refused(entry):
        raise RequestTooLarge("the long prompt does not fit the long model's window")

    loop.shadow = lambda parent, given, run_long: shadow(parent, given, refused)
    raw = ask(url, QUESTION, documents=[{"text": manual()}])
    assert raw.parse().choices[0].message.content == TRUSTED
    settle(app, server)
    row = next(r for r in rows(app, "requests") if r["route"] == "shadow")
    assert row["status"] == 413 and "does not fit" in row["error"]
    assert rows(app, "labels") == []


def test_the_shadow_rate_falls_with_the_context_over_the_reference():
    from gateway.routing.learning.loop import shadow_probability
    from policies.schema import LearningSettings

    flat = LearningSettings(judge=True, shadow_rate=0.05)
    tied = LearningSettings(judge=True, shadow_rate=0.05, shadow_reference_tokens=16_000)
    assert (
        shadow_probability(flat, 128_000) == shadow_probability(tied, 8_000) == shadow_probability(tied, None) == 0.05
    )
    assert shadow_probability(tied, 128_000) == pytest.approx(0.05 / 8)  # 8x the tokens: an eighth of the shadows
    # the expected shadow tokens per accepted answer stay at most rate x reference
    assert max(shadow_probability(tied, t) * t for t in (1e3, 16e3, 64e3, 1e6)) == pytest.approx(0.05 * 16_000)


def test_the_shadow_backoff_scales_the_rate_and_follows_the_refits():
    """shadow_backoff: shadows drawn at shadow_rate x scale (with the reference tokens' cut on top); a losing refit
    multiplies the scale by the factor, a winning one divides by it, never under min_scale nor over 1."""
    from gateway.routing.learning.loop import shadow_probability, shadow_scale_after
    from policies.schema import LearningSettings, ShadowBackoff

    backoff = ShadowBackoff(factor=0.5, min_scale=0.2, scale=0.5)
    settings = LearningSettings(judge=True, shadow_rate=0.1, shadow_reference_tokens=16_000, shadow_backoff=backoff)
    assert shadow_probability(settings, 8_000) == pytest.approx(0.05)
    assert shadow_probability(settings, 32_000) == pytest.approx(0.025)
    assert shadow_scale_after(backoff, won=False) == pytest.approx(0.25)
    assert shadow_scale_after(backoff, won=True) == pytest.approx(1.0)
    scale = 1.0
    for _ in range(5):
        scale = shadow_scale_after(backoff.model_copy(update={"scale": scale}), won=False)
    assert scale == pytest.approx(0.2)  # the floor
    assert shadow_scale_after(backoff.model_copy(update={"scale": 1.0}), won=True) == 1.0  # never above shadow_rate


@pytest.mark.parametrize(("scale", "shadows"), [(0.0, 0), (1.0, 2)])
def test_the_live_draw_is_at_the_backoffs_scale_and_records_its_chance(
    upstream, verifier_file, gateway, scale, shadows
):
    """shadow_rate 1.0 at the backoff's scale: 0 shadows none, 1 every accepted answer; each checked answer records
    the chance it had (what `learn` weighs its shadow label by, whatever scale is in force when learn runs)."""
    from policies.schema import ShadowBackoff

    upstream[1].state.scripted = TRUSTED
    upstream[1].state.judge_reply = '{"verdict": "as_good"}'
    backoff = ShadowBackoff(factor=0.5, min_scale=0.0, scale=scale)
    url, app, server = gateway(learning_policy(upstream[0], verifier_file, shadow_rate=1.0, shadow_backoff=backoff))
    for i in range(2):
        ask(url, f"{QUESTION} {i}", documents=[{"text": manual()}])
    settle(app, server)
    assert [r["route"] for r in rows(app, "requests")].count("shadow") == shadows
    chances = [json.loads(r["data"])["shadow_chance"] for r in rows(app, "request_features")]
    assert chances == [scale, scale]


@pytest.mark.parametrize(("reference", "shadows"), [(10**7, 3), (1, 0)])
def test_the_live_draw_reads_the_requests_context_tokens(upstream, verifier_file, gateway, reference, shadows):
    """shadow_rate 1.0: every answer shadowed while its context is under the reference; with a reference of one token
    the chance is 1 / the context's tokens (seeded draws: none of three here)."""
    import random

    upstream[1].state.scripted = TRUSTED
    upstream[1].state.judge_reply = '{"verdict": "as_good"}'
    policy = learning_policy(upstream[0], verifier_file, shadow_rate=1.0, shadow_reference_tokens=reference)
    url, app, server = gateway(policy)
    app.state.gateway.routing.learning._rng = random.Random(0)
    for i in range(3):
        ask(url, f"{QUESTION} {i}", documents=[{"text": manual()}])
    settle(app, server)
    routes = [r["route"] for r in rows(app, "requests")]
    assert routes.count("rag") == 3 and routes.count("shadow") == shadows


def test_a_shadow_is_not_stopped_by_its_requests_client_leaving(upstream, verifier_file, tmp_path):
    """The shadow starts once the answer is made, inside the request's cancel scope; a client leaving then (its
    threads told to stop) must not stop the shadow's threads: they would give up an ingestion the long route waits
    for, and the shadow would be ledgered as a failure."""
    import asyncio

    import anyio

    from gateway.ledger.entry import RequestLedgerEntry
    from gateway.ledger.pricing import PriceBook
    from gateway.ledger.writer import Ledger
    from gateway.routing.learning.loop import JudgeInput, LearningLoop
    from gateway.server.app import default_upstream
    from pipelines.cancellation import cancel_scope, cancelled

    upstream[1].state.judge_reply = '{"verdict": "as_good"}'
    policy = learning_policy(upstream[0], verifier_file, shadow_rate=1.0)
    recorded, seen = [], []
    ledger = Ledger(tmp_path / "ledger.sqlite3")

    async def run_long(entry) -> dict:
        await asyncio.sleep(0.1)  # the client leaves meanwhile
        seen.append(await anyio.to_thread.run_sync(cancelled))  # what the long route's worker threads see
        return {"choices": [{"message": {"role": "assistant", "content": "The long answer."}}]}

    async def main() -> None:
        provider = default_upstream()
        loop = LearningLoop(policy, provider, lambda entry, outcome: recorded.append((entry.record.route, outcome)))
        parent = RequestLedgerEntry(ledger, PriceBook(), "req-1", "default")
        with cancel_scope() as client_left:
            loop.shadow(parent, JudgeInput("Q?", ["passage"], "The cheap answer."), run_long)
            client_left.set()
        await loop.aclose(grace_s=30)
        await provider.aclose()

    asyncio.run(main())
    ledger.close()
    assert seen == [False]
    assert [(route, outcome.status) for route, outcome in recorded] == [("shadow", 200), ("judge", 200)]
