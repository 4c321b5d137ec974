"""The dashboard's data: one summary of the last window (GET /v1/admin/summary), built on gateway.reports.

Totals, route mix and the spend series come from the rollups in one aggregate; latency percentiles from the
hourly latency histograms (migration 003), estimated inside buckets as Prometheus does; the most expensive
and slowest requests from the raw rows of the window.
"""
from __future__ import annotations

import bisect
import math
import time
from typing import Any

from gateway.ledger.dialect import LedgerConnection
from gateway.ledger.reports import (
    REQUEST_COLUMNS, REQUEST_FIELDS, Filters, attach_models, cost_row, row_dict, aggregate,
    group_label,
)
from policies.routes import FALLBACK as FALLBACK_ROUTE



def latency_histograms(conn: LedgerConnection, since: float) -> tuple[list[float], dict[str, list[int]]]:
    """Request counts per latency bucket and route since `since`: whole hours from the rollup, the rest raw."""
    edges = [row[0] for row in conn.execute("SELECT upper_ms FROM latency_buckets ORDER BY bucket")]
    counts: dict[str, list[int]] = {}
    first_hour = math.ceil(since / 3600)
    for route, bucket, n in conn.execute("SELECT route, bucket, sum(requests) FROM latency_rollup_hourly"
                                         " WHERE hour >= ? GROUP BY 1, 2", (first_hour,)):
        counts.setdefault(route, [0] * len(edges))[bucket] += n
    for route, latency in conn.execute(
            "SELECT coalesce(route, ''), latency_ms FROM requests WHERE created_at >= ? AND created_at < ?"
            " AND latency_ms IS NOT NULL", (since, first_hour * 3600.0)):
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


def _top(conn: LedgerConnection, order: str, since: float, limit: int) -> list[dict]:
    rows = conn.execute(f"SELECT {', '.join(REQUEST_COLUMNS)} FROM requests WHERE created_at >= ?"
                        f" AND {order} IS NOT NULL ORDER BY {order} DESC LIMIT ?", (since, limit)).fetchall()
    items = [row_dict(row) for row in rows]
    attach_models(conn, items)
    return items


def _route_name(route: str) -> str:
    return route or "unknown"  # the rollups store a NULL route as ''


def summary(conn: LedgerConnection, *, window: float, now: float | None = None, top: int = 10) -> dict:
    """Everything the dashboard draws for the last `window` seconds."""
    now = time.time() if now is None else now
    since = now - window
    bucket = "hour" if window <= 2 * 86400 else "day"
    step = 3600 if bucket == "hour" else 86400
    window_filter = Filters(since=since)
    # one pass over the rollups; route totals, errors and the series are sums of its cells
    cells = aggregate(conn, [bucket, "route", "status"], window_filter)
    by_route: dict[tuple, dict] = {}
    series_slots: dict[tuple, dict] = {}
    totals = dict.fromkeys(REQUEST_FIELDS, 0)
    errors = 0
    for (index, route, status), slot in cells.items():
        for target in (by_route.setdefault((route,), dict.fromkeys(REQUEST_FIELDS, 0)),
                       series_slots.setdefault((index, route), dict.fromkeys(REQUEST_FIELDS, 0)), totals):
            for name in REQUEST_FIELDS:
                target[name] += slot[name]
        if status >= 400:
            errors += slot["requests"]
    routes = sorted((key[0] for key in by_route), key=lambda r: -by_route[(r,)]["cost_usd"])
    first, last = int(since // step), int(now // step)
    series = []
    for index in range(first, last + 1):
        cells = {route: series_slots.get((index, route)) for route in routes}
        series.append({
            "t": group_label(bucket, index),
            "start": index * step,
            "cost_usd": {_route_name(r): (cell["cost_usd"] if cell else 0.0) for r, cell in cells.items()},
            "requests": {_route_name(r): (cell["requests"] if cell else 0) for r, cell in cells.items()},
        })
    mix = [{**cost_row(_route_name(route), by_route[(route,)], calls=False),
            "share": by_route[(route,)]["requests"] / totals["requests"] if totals["requests"] else 0.0}
           for route in routes]
    attempts = sum(by_route[(r,)]["requests"] for r in ("rag", FALLBACK_ROUTE) if (r,) in by_route)
    fallbacks = by_route[(FALLBACK_ROUTE,)]["requests"] if (FALLBACK_ROUTE,) in by_route else 0
    edges, histograms = latency_histograms(conn, since)
    latency = {_route_name(route): histogram_percentiles(edges, counts) for route, counts in histograms.items()}
    latency["all"] = histogram_percentiles(edges, [sum(c) for c in zip(*histograms.values())] or [0] * len(edges))
    models = aggregate(conn, ["model"], window_filter, calls=True)
    total_row = cost_row(None, totals, calls=False)
    counterfactual = total_row["counterfactual_cost_usd"]
    return {
        "now": now,
        "since": since,
        "window_s": window,
        "bucket": bucket,
        "routes": [_route_name(route) for route in routes],
        "totals": {**total_row, "errors": errors,
                   "error_rate": errors / totals["requests"] if totals["requests"] else 0.0,
                   "saving_pct": (total_row["saving_usd"] / counterfactual) if counterfactual else None},
        "fallback": {"fallbacks": fallbacks, "rag_attempts": attempts,
                     "rate": fallbacks / attempts if attempts else None},
        "series": series,
        "route_mix": mix,
        "models": sorted((cost_row(key[0], slot, calls=True) for key, slot in models.items()),
                         key=lambda r: -r["cost_usd"]),
        "latency_ms": latency,  # estimated from histogram buckets, see latency_histograms
        "most_expensive": _top(conn, "cost_usd", since, top),
        "slowest": _top(conn, "latency_ms", since, top),
    }
