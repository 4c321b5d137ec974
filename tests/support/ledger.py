"""Small, known ledgers for the report, admin, metrics, dashboard and CLI tests."""

from __future__ import annotations

import random
import time
from pathlib import Path

from starlette.applications import Starlette

from classifier.features import FEATURE_NAMES
from gateway.errors import GatewayError
from gateway.ledger.pricing import PriceBook
from gateway.ledger.records import LabelRecord, RequestRecord, UpstreamCall
from gateway.ledger.writer import Ledger
from gateway.routing.model_files import load_route_model, load_verifier_model
from gateway.server.auth import Authenticator
from gateway.server.errors import handle_error
from gateway.server.state import Gateway
from gateway.settings import Settings
from policies.loader import load_policy

BASE = 1_767_225_600.0  # 2026-01-01T00:00:00Z
ADMIN_KEY = "sk-admin-test"
USER_KEY = "sk-user-test"
CHEAP = "openai/gpt-4o-mini"
LONG = "openai/gpt-4.1"


def call(
    model: str, route: str, prompt: int, completion: int, cost: float, latency: float = 100.0, error: str | None = None
) -> UpstreamCall:
    return UpstreamCall(
        model=model,
        route=route,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=cost,
        latency_ms=latency,
        error=error,
        created_at=BASE,
    )


def cached(leg: UpstreamCall, tokens: int, saving: float) -> UpstreamCall:
    """`leg` with `tokens` of its prompt read from the provider's cache, saving `saving` (negative: a write)."""
    leg.cached_tokens, leg.cache_saving_usd = tokens, saving
    return leg


def record(
    rid: str,
    at: float,
    route: str | None,
    calls: list[UpstreamCall],
    *,
    key: str = "k_alice",
    policy: str = "default",
    status: int = 200,
    counterfactual: float = 0.0,
    context: int = 0,
    latency: float | None = 500.0,
    reason: str = "classifier",
    provenance: dict | None = None,
) -> RequestRecord:
    return RequestRecord(
        id=rid,
        created_at=at,
        key_id=key,
        policy=policy,
        alias="selfroute-auto",
        route=route,
        reason=reason,
        status=status,
        error=None if status < 400 else "upstream failed",
        latency_ms=latency,
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
        cost_usd=sum(c.cost_usd for c in calls),
        context_tokens=context,
        counterfactual_cost_usd=counterfactual,
        provenance=provenance,
        calls=calls,
        cached_tokens=sum(c.cached_tokens for c in calls),
        cache_saving_usd=sum(c.cache_saving_usd for c in calls),
    )


def sample_records() -> list[RequestRecord]:
    """Ten requests over two UTC days with known costs (see the assertions in the tests)."""
    rag = lambda: call(CHEAP, "rag", 1000, 50, 0.001, 300.0)  # noqa: E731
    longc = lambda: call(LONG, "long", 20000, 80, 0.04, 2000.0)  # noqa: E731
    return [
        record(
            "r01",
            BASE + 600,
            "rag",
            [rag()],
            counterfactual=0.041,
            context=20000,
            latency=400,
            provenance={"chunks": [{"doc": "a.txt", "chunk": 3}]},
        ),
        record("r02", BASE + 1800, "rag", [rag()], counterfactual=0.041, context=20000, latency=350),
        record("r03", BASE + 3700, "long", [longc()], counterfactual=0.04, context=20000, latency=2100),
        record(
            "r04",
            BASE + 5400,
            "rag>long",
            [rag(), longc()],
            counterfactual=0.04,
            context=20000,
            latency=2600,
            key="k_bob",
        ),
        record(
            "r05",
            BASE + 7300,
            "direct",
            [call(CHEAP, "direct", 50, 20, 0.0001, 120.0)],
            counterfactual=0.0003,
            context=50,
            latency=150,
            policy="strict",
        ),
        record(
            "r06",
            BASE + 7400,
            "rag",
            [call(CHEAP, "rag", 900, 0, 0.0, 5000.0, error="timeout")],
            status=502,
            counterfactual=0.0,
            context=20000,
            latency=5100,
            key="k_bob",
        ),
        record("r07", BASE + 86400 + 100, "long", [longc()], counterfactual=0.04, context=20000, latency=1900),
        record(
            "r08", BASE + 86400 + 200, "rag", [rag()], counterfactual=0.041, context=20000, latency=420, policy="strict"
        ),
        record(
            "r09", BASE + 86400 + 4000, "rag>long", [rag(), longc()], counterfactual=0.04, context=20000, latency=2900
        ),
        record("r10", BASE + 86400 + 4100, None, [], status=400, counterfactual=0.0, latency=3, reason=None),
    ]


def write_ledger(location: Path | str, records: list[RequestRecord], dead_letter_dir: Path | None = None) -> Ledger:
    """A ledger at `location` (a SQLite path or a postgresql:// URL) holding `records`, flushed."""
    if dead_letter_dir is None and isinstance(location, Path):
        dead_letter_dir = location.parent
    ledger = Ledger(location, dead_letter_dir=dead_letter_dir)
    for rec in records:
        ledger.submit(rec)
    ledger.flush()
    return ledger


def admin_app(ledger: Ledger, auth: Authenticator | None = None, metrics=None) -> Starlette:
    """The admin and metrics routes in a bare app, with a Gateway holding only what they use (no models)."""
    from gateway.ledger.errors import LedgerError
    from gateway.server.admin import admin_routes
    from gateway.server.metrics import GatewayMetrics, metrics_route

    app = Starlette(
        routes=[*admin_routes(), metrics_route()],
        exception_handlers={GatewayError: handle_error, LedgerError: handle_error},
    )
    app.state.gateway = bare_gateway(ledger, auth or Authenticator([USER_KEY], ADMIN_KEY), metrics or GatewayMetrics())
    return app


def bare_gateway(ledger: Ledger, auth: Authenticator, metrics) -> Gateway:
    """A Gateway for endpoints that read only the ledger, auth and metrics: no upstream and no routing."""
    settings = Settings(data_dir=ledger.dead_letter_path.parent)
    from gateway.ledger.keys import KeyStore

    return Gateway(
        settings, load_policy(None)[0], None, None, ledger, auth, PriceBook(), None, metrics, KeyStore(ledger.location)
    )


def synthetic_records(
    count: int, *, now: float, span: float = 86400.0, seed: int = 0, cache_reads: float = 0.0
) -> list[RequestRecord]:
    """A plausible day of traffic (fixed seed): mostly RAG, some long, a few fallbacks and errors. With
    `cache_reads`, that share of the long legs read 90% of their prompt from the provider's cache (at a quarter of
    the input price); the others write it (at 1.25 times the input price)."""
    import random

    rng = random.Random(seed)
    cache_rng = random.Random(seed + 1)  # its own draws: the traffic is the same with or without caching
    out = []
    for i in range(count):
        at = now - rng.uniform(0, span)
        route = rng.choices(["rag", "long", "rag>long", "direct"], [60, 22, 12, 6])[0]
        context = rng.randrange(8_000, 120_000)
        completion = rng.randrange(20, 400)
        cheap = call(CHEAP, "rag", rng.randrange(600, 3000), completion, 0.0, rng.uniform(300, 1500))
        cheap.cost_usd = cheap.prompt_tokens * 0.15e-6 + completion * 0.6e-6
        longc = call(LONG, "long", context, completion, context * 2e-6 + completion * 8e-6, rng.uniform(1500, 9000))
        if cache_reads:
            block = context * 9 // 10
            saving = block * 1.5e-6 if cache_rng.random() < cache_reads else -block * 0.5e-6
            cached(longc, block if saving > 0 else 0, saving)
            longc.cost_usd -= saving
        calls = {
            "rag": [cheap],
            "long": [longc],
            "rag>long": [cheap, longc],
            "direct": [call(CHEAP, "direct", 200, completion, 0.0002, rng.uniform(200, 800))],
        }[route]
        status = 502 if rng.random() < 0.03 else 200
        if status == 502:
            calls[-1].error = "upstream timeout"
        out.append(
            record(
                f"req-{seed}-{i:05d}",
                at,
                route,
                calls,
                key=rng.choice(["k_alice", "k_bob", "k_carol"]),
                # as the gateway's ledger entry: a long leg that answered is the counterfactual itself
                status=status,
                counterfactual=longc.cost_usd if route in ("long", "rag>long") else context * 2e-6 + completion * 8e-6,
                context=context,
                latency=sum(c.latency_ms or 0 for c in calls) + rng.uniform(20, 200),
            )
        )
    return out


def recorded_ledger(
    path, n: int = 240, seed: int = 0, labelled: bool = True, route_signal: bool = False, wrong_refusals: bool = False
) -> float:
    """Cheap answers whose goodness the shipped verifier cannot see: good when ans_support_passages is LOW (a
    deployment where the shipped features mean something else), judged on every escalation and some shadows.
    With `route_signal`, goodness is instead written in a pre-route feature (top_score LOW), recorded with every
    pre-route feature and the shipped classifier's P(cheap). With `wrong_refusals`, every fourth answer is a refusal
    (recorded as refused, escalated only by the threshold) and is worse than the long answer; the others are good
    (nothing a refit of the verifier's features could learn)."""
    policy, _ = load_policy(None)
    verifier = load_verifier_model(policy, None)
    route_model = load_route_model(policy, None)
    rng = random.Random(seed)
    ledger = Ledger(path)
    now = time.time() - 3600
    rows = []
    for _ in range(n):
        row = {name: rng.random() for name in verifier.feature_names}  # varied: no ties in P(good)
        row.update(pre_route_probability=0.8)
        rows.append(row)
    scores = verifier.scores(rows)
    threshold = sorted(scores)[n // 2]  # the policy in force escalates half
    for i, (row, p_good) in enumerate(zip(rows, scores)):
        support = row["ans_support_passages"]
        pre_route = {"context_tokens": 5000.0, "top_score": None}
        p_cheap = None
        if route_signal:
            pre_route = {name: rng.random() for name in FEATURE_NAMES}
            support, p_cheap = pre_route["top_score"], route_model.cheap_probability(pre_route)
        escalated = p_good < threshold
        good = (support < 0.5) if rng.random() < 0.9 else (support >= 0.5)
        refused = wrong_refusals and i % 4 == 0
        if wrong_refusals:
            good = not refused
        cheap, long_cost = 0.001, 0.01
        rid = f"req_{i:04d}"
        ledger.submit(
            RequestRecord(
                id=rid,
                created_at=now + i,
                key_id="k_a",
                policy="learned",
                alias="selfroute",
                route="rag>long" if escalated else "rag",
                reason=None,
                status=200,
                cost_usd=cheap + (long_cost if escalated else 0.0),
                counterfactual_cost_usd=long_cost,
                features={
                    "version": 1,
                    "features": pre_route,
                    "p_cheap": p_cheap,
                    "threshold": None,
                    "rule": None,
                    "decision": "rag",
                    "group": f"g{i % 12}",
                    "verifier_features": row,
                    "p_good": p_good,
                    "verifier_threshold": threshold,
                    "refused": refused,
                    "escalated": escalated,
                    "outcome": "rag>long" if escalated else "rag",
                },
            )
        )
        source = "judge" if escalated else ("shadow" if rng.random() < 0.2 else None)
        if labelled and source:
            ledger.submit(
                RequestRecord(
                    id=f"judge_{i:04d}",
                    created_at=now + i + 0.5,
                    key_id=None,
                    policy="learned",
                    alias=None,
                    route="judge",
                    reason=None,
                    status=200,
                    cost_usd=0.0005,
                    labels=[LabelRecord(rid, source, good, "as_good" if good else "worse", "k_a", cost_usd=0.0005)],
                )
            )
    ledger.flush()
    ledger.close()
    return threshold


def relative_ledger(
    path, policy, n: int = 480, seed: int = 0, bad_groups: set[str] | None = None, dead_letter_dir: Path | None = None
) -> None:
    """Checked cheap answers escalated as `policy`'s relative rule (routing.verifier.relative) escalated them, in
    order, with the long tokens it charged; a fifth are refusals. An answer in the lowest 45% of the shipped verifier's
    P(good) is worse than the long one (only in `bad_groups`' documents, when given: a gain no other document shows);
    judged on every escalation and on a fifth of the rest (shadows, the policy's shadow_rate)."""
    from gateway.evaluation.relative_refit import CheckedStream, relative_escalations
    from gateway.routing.decision import RouteDecision
    from policies.routes import Route

    verifier = load_verifier_model(policy, None)
    rng = random.Random(seed)
    rows = [{name: rng.random() for name in verifier.feature_names} | {"pre_route_probability": 0.8} for _ in range(n)]
    scores = [float(s) for s in verifier.scores(rows)]
    refused = [i % 5 == 0 for i in range(n)]
    tokens = [1000.0 + 500.0 * (i % 3) for i in range(n)]
    decision = RouteDecision(Route.RAG, "", None, None, {"context_tokens": 5000.0})
    escalated = relative_escalations(policy, CheckedStream(scores, refused, tokens, [decision] * n, ["k_a"] * n))
    low = sorted(scores)[int(0.45 * n)]
    ledger = Ledger(path, dead_letter_dir=dead_letter_dir)  # (PostgreSQL needs one)
    now = time.time() - 3600
    for i in range(n):
        group = f"g{i % 12}"
        good = scores[i] >= low or (bad_groups is not None and group not in bad_groups)
        rid = f"req_{i:04d}"
        ledger.submit(
            RequestRecord(
                id=rid,
                created_at=now + i,
                key_id="k_a",
                policy="learned",
                alias="selfroute",
                route="rag>long" if escalated[i] else "rag",
                reason=None,
                status=200,
                cost_usd=0.001 + (0.01 if escalated[i] else 0.0),
                counterfactual_cost_usd=0.01,
                features={
                    "version": 1,
                    "features": {"context_tokens": 5000.0},
                    "p_cheap": None,
                    "threshold": None,
                    "rule": None,
                    "decision": "rag",
                    "group": group,
                    "verifier_features": rows[i],
                    "p_good": scores[i],
                    "refused": refused[i],
                    "escalated": escalated[i],
                    "long_tokens": tokens[i],
                    "outcome": "rag>long" if escalated[i] else "rag",
                },
            )
        )
        source = "judge" if escalated[i] else ("shadow" if rng.random() < 0.2 else None)
        if source:
            ledger.submit(
                RequestRecord(
                    id=f"judge_{i:04d}",
                    created_at=now + i + 0.5,
                    key_id=None,
                    policy="learned",
                    alias=None,
                    route="judge",
                    reason=None,
                    status=200,
                    cost_usd=0.0005,
                    labels=[LabelRecord(rid, source, good, "as_good" if good else "worse", "k_a", cost_usd=0.0005)],
                )
            )
    ledger.flush()
    ledger.close()
