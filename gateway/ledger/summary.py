"""The dashboard's data: one summary of the last window (GET /v1/admin/summary), built on gateway.reports.

Totals, route mix, keys and the spend series come from the rollups (the series from raw rows when its buckets
are shorter than an hour); latency percentiles from the recorded latencies of the window, exact, while it
holds at most RAW_LATENCY_LIMIT requests (reading more would take seconds), else estimated from the hourly
latency histograms (migration 003); the most expensive and slowest requests from the raw rows of the window;
the provider prompt cache per route from the call rollups' cache columns (migration 008).
"""

from __future__ import annotations

import bisect
import math
import time
from datetime import UTC, datetime
from typing import Any

from gateway.ledger.dialect import LedgerConnection, dialect_of
from gateway.ledger.records import IN_FLIGHT, REQUEST_FIELDS_STORED
from gateway.ledger.reports import (
    REQUEST_FIELDS,
    Filters,
    aggregate,
    attach_models,
    cost_row,
    row_dict,
    unpriced_models,
)
from policies.routes import FALLBACK as FALLBACK_ROUTE

# (longest window, bucket seconds, name): about 24-72 bars whatever the window
BUCKETS = (
    (2 * 3600, 60, "minute"),
    (12 * 3600, 600, "10 minutes"),
    (2 * 86400, 3600, "hour"),
    (14 * 86400, 6 * 3600, "6 hours"),
    (float("inf"), 86400, "day"),
)
PERCENTILES = (50, 90, 95, 99)
# exact percentiles read every latency of the window: about 0.1 s per 100,000 requests on one idle core
RAW_LATENCY_LIMIT = 200_000


def bucket_for(window: float) -> tuple[int, str]:
    """The series' bucket size in seconds, and its name, for a window of `window` seconds."""
    return next((step, name) for longest, step, name in BUCKETS if window <= longest)


def percentiles(values: list[float]) -> dict:
    """count and p50/p90/p95/p99 of recorded values, by linear interpolation between the closest ranks."""
    values = sorted(values)
    out: dict[str, Any] = {"count": len(values)}
    for p in PERCENTILES:
        if not values:
            out[f"p{p}"] = None
            continue
        rank = p / 100 * (len(values) - 1)
        low = int(rank)
        high = min(low + 1, len(values) - 1)
        out[f"p{p}"] = values[low] + (values[high] - values[low]) * (rank - low)
    return out


def latency_percentiles(conn: LedgerConnection, since: float, until: float) -> dict[str, dict]:
    """Percentiles of the requests' recorded latencies per route and for all, over [since, until)."""
    by_route: dict[str, list[float]] = {}
    rows = conn.execute(
        "SELECT coalesce(route, ''), latency_ms FROM requests"
        " WHERE created_at >= ? AND created_at < ? AND latency_ms IS NOT NULL",
        (since, until),
    ).fetchall()
    for route, latency in rows:
        by_route.setdefault(route, []).append(latency)
    out = {_route_name(route): percentiles(values) for route, values in by_route.items()}
    out["all"] = percentiles([v for values in by_route.values() for v in values])
    return out


def latency_histograms(conn: LedgerConnection, since: float) -> tuple[list[float], dict[str, list[int]]]:
    """Request counts per latency bucket and route since `since`: whole hours from the rollup, the rest raw."""
    edges = [row[0] for row in conn.execute("SELECT upper_ms FROM latency_buckets ORDER BY bucket")]
    counts: dict[str, list[int]] = {}
    first_hour = math.ceil(since / 3600)
    for route, bucket, n in conn.execute(
        "SELECT route, bucket, sum(requests) FROM latency_rollup_hourly WHERE hour >= ? GROUP BY 1, 2", (first_hour,)
    ):
        counts.setdefault(route, [0] * len(edges))[bucket] += n
    for route, latency in conn.execute(
        "SELECT coalesce(route, ''), latency_ms FROM requests WHERE created_at >= ? AND created_at < ?"
        " AND latency_ms IS NOT NULL",
        (since, first_hour * 3600.0),
    ):
        counts.setdefault(route, [0] * len(edges))[bisect.bisect_left(edges, latency)] += 1
    return edges, counts


def histogram_percentiles(edges: list[float], counts: list[int]) -> dict:
    """p50/p90/p95/p99 by linear interpolation inside the bucket that holds the rank (as Prometheus does)."""
    total = sum(counts)
    out: dict[str, Any] = {"count": total}
    for p in (50, 90, 95, 99):
        out[f"p{p}"] = None
        rank, seen = p / 100 * total, 0
        for i, n in enumerate(counts):
            if n and seen + n >= rank:
                lower = edges[i - 1] if i else 0.0
                upper = edges[i] if i < len(edges) - 1 else lower  # the last bucket has no upper bound
                out[f"p{p}"] = lower + (upper - lower) * (rank - seen) / n
                break
            seen += n
    return out


def window_latency(conn: LedgerConnection, since: float, until: float, requests: int) -> tuple[dict, str]:
    """Latency percentiles per route and for all, and where they came from: "recorded" or "histogram"."""
    if requests <= RAW_LATENCY_LIMIT:
        return latency_percentiles(conn, since, until), "recorded"
    edges, histograms = latency_histograms(conn, since)
    latency = {_route_name(route): histogram_percentiles(edges, counts) for route, counts in histograms.items()}
    latency["all"] = histogram_percentiles(edges, [sum(c) for c in zip(*histograms.values())] or [0] * len(edges))
    return latency, "histogram"


def _series_cells(conn: LedgerConnection, since: float, until: float, step: int) -> dict[tuple, dict]:
    """(bucket index, route) -> {cost_usd, requests}: from raw rows for sub-hour buckets, else the rollups."""
    cells: dict[tuple, dict] = {}
    if step < 3600:
        index_sql = dialect_of(conn).bucket("created_at", step)
        for index, route, requests, cost in conn.execute(
            f"SELECT {index_sql}, coalesce(route, ''), count(*), coalesce(sum(cost_usd), 0) FROM requests"
            " WHERE created_at >= ? AND created_at < ? GROUP BY 1, 2",
            (since, until),
        ):
            cells[(index, route)] = {"cost_usd": cost, "requests": requests}
        return cells
    unit, seconds = ("day", 86400) if step % 86400 == 0 else ("hour", 3600)
    for (index, route), slot in aggregate(conn, [unit, "route"], Filters(since=since, until=until)).items():
        cell = cells.setdefault((index * seconds // step, route), {"cost_usd": 0.0, "requests": 0})
        cell["cost_usd"] += slot["cost_usd"]
        cell["requests"] += slot["requests"]
    return cells


def _label(start: float, step: int) -> str:
    moment = datetime.fromtimestamp(start, UTC)
    return moment.strftime("%Y-%m-%d") if step >= 86400 else moment.strftime("%Y-%m-%dT%H:%MZ")


def _top(conn: LedgerConnection, order: str, since: float, limit: int) -> list[dict]:
    rows = conn.execute(
        f"SELECT {', '.join(REQUEST_FIELDS_STORED)} FROM requests WHERE created_at >= ?"
        f" AND {order} IS NOT NULL ORDER BY {order} DESC LIMIT ?",
        (since, limit),
    ).fetchall()
    items = [row_dict(row) for row in rows]
    attach_models(conn, items)
    return items


def _route_name(route: str) -> str:
    return route or "unknown"  # the rollups store a NULL route as ''


def _cache_row(route: str | None, legs: dict) -> dict:
    """One route's prompt cache: of its upstream calls, those that read the provider's cache; of their prompt
    tokens, those read from it; and what that saved (cache writes count against it)."""
    return {
        "group": route,
        "calls": legs["calls"],
        "cache_hits": legs["cache_hits"],
        "hit_rate": legs["cache_hits"] / legs["calls"] if legs["calls"] else None,
        "prompt_tokens": legs["prompt_tokens"],
        "cached_tokens": legs["cached_tokens"],
        "cached_share": legs["cached_tokens"] / legs["prompt_tokens"] if legs["prompt_tokens"] else None,
        "cache_saving_usd": round(legs["cache_saving_usd"], 10),
    }


def prompt_cache(legs: dict[str, dict], routes: list[str]) -> dict:
    """Per route (in `routes` order, those with calls) and in total, from the legs' sums per request route."""
    fields = ("calls", "prompt_tokens", "cache_hits", "cached_tokens", "cache_saving_usd")
    total = {name: sum(slot[name] for slot in legs.values()) for name in fields}
    return {
        "routes": [_cache_row(_route_name(route), legs[route]) for route in routes if route in legs],
        "total": _cache_row(None, total),
    }


def summary(conn: LedgerConnection, *, window: float, now: float | None = None, top: int = 10) -> dict:
    """Everything the dashboard draws for the last `window` seconds."""
    now = time.time() if now is None else now
    since = now - window
    step, bucket = bucket_for(window)
    window_filter = Filters(since=since)
    # one pass over the rollups; route totals and errors are sums of its cells
    cells = aggregate(conn, ["route", "status"], window_filter)
    by_route: dict[tuple, dict] = {}
    totals = dict.fromkeys(REQUEST_FIELDS, 0)
    errors = unfinished = 0
    for (route, status), slot in cells.items():
        for target in (by_route.setdefault((route,), dict.fromkeys(REQUEST_FIELDS, 0)), totals):
            for name in REQUEST_FIELDS:
                target[name] += slot[name]
        if status >= 400 or status == IN_FLIGHT:  # a request its stopped process never finished is no success
            errors += slot["requests"]
        if status == IN_FLIGHT:
            unfinished += slot["requests"]
    routes = sorted((key[0] for key in by_route), key=lambda r: -by_route[(r,)]["cost_usd"])
    series_cells = _series_cells(conn, since, now + 1e-6, step)
    series = []
    for index in range(int(since // step), int(now // step) + 1):
        slots = {route: series_cells.get((index, route)) for route in routes}
        series.append(
            {
                "t": _label(index * step, step),
                "start": index * step,
                "cost_usd": {_route_name(r): (cell["cost_usd"] if cell else 0.0) for r, cell in slots.items()},
                "requests": {_route_name(r): (cell["requests"] if cell else 0) for r, cell in slots.items()},
            }
        )
    mix = [
        {
            **cost_row(_route_name(route), by_route[(route,)], calls=False),
            "share": by_route[(route,)]["requests"] / totals["requests"] if totals["requests"] else 0.0,
        }
        for route in routes
    ]
    attempts = sum(by_route[(r,)]["requests"] for r in ("rag", FALLBACK_ROUTE) if (r,) in by_route)
    fallbacks = by_route[(FALLBACK_ROUTE,)]["requests"] if (FALLBACK_ROUTE,) in by_route else 0
    unpriced = unpriced_models(conn, window_filter)
    unpriced_names = {u["model"] for u in unpriced}
    # one pass over the call rollups for the model panel and the cache panel's calls and prompt tokens
    models: dict[tuple, dict] = {}
    legs: dict[str, dict] = {}
    for (model, route), slot in aggregate(conn, ["model", "route"], window_filter, calls=True).items():
        for target in (
            models.setdefault((model,), dict.fromkeys(slot, 0)),
            legs.setdefault(route, dict.fromkeys(slot, 0)),
        ):
            for name, value in slot.items():
                target[name] += value
    keys = aggregate(conn, ["key"], window_filter)
    total_row = cost_row(None, totals, calls=False)
    counterfactual = total_row["counterfactual_cost_usd"]
    latency, latency_source = window_latency(conn, since, now + 1e-6, totals["requests"])
    return {
        "now": now,
        "since": since,
        "window_s": window,
        "bucket": bucket,
        "bucket_s": step,
        "routes": [_route_name(route) for route in routes],
        "totals": {
            **total_row,
            "errors": errors,
            "unfinished": unfinished,
            "error_rate": errors / totals["requests"] if totals["requests"] else 0.0,
            "saving_pct": (total_row["saving_usd"] / counterfactual) if counterfactual else None,
            "saved_tokens_pct": (total_row["saved_tokens"] / total_row["always_long_tokens"])
            if total_row["always_long_tokens"]
            else None,
        },
        "fallback": {
            "fallbacks": fallbacks,
            "rag_attempts": attempts,
            "rate": fallbacks / attempts if attempts else None,
        },
        "series": series,
        "route_mix": mix,
        "models": sorted(
            (
                {**cost_row(key[0], slot, calls=True), "unpriced": key[0] in unpriced_names}
                for key, slot in models.items()
            ),
            key=lambda r: -r["cost_usd"],
        ),
        "unpriced_models": unpriced,
        "prompt_cache": prompt_cache(legs, routes),
        "keys": sorted(
            (cost_row(key[0] or None, slot, calls=False) for key, slot in keys.items()),
            key=lambda r: (-r["cost_usd"], -r["requests"]),
        ),
        "latency_ms": latency,
        "latency_source": latency_source,  # "recorded" (exact) or "histogram" (estimated, for huge windows)
        "most_expensive": _top(conn, "cost_usd", since, top),
        "slowest": _top(conn, "latency_ms", since, top),
    }
