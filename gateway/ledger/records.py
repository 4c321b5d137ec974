"""What the ledger stores: one record per request with its upstream legs. Column names are defined here once."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

LEDGER_FILE = "ledger.sqlite3"  # inside the data directory

# requests.status values that are not an answer sent: 499 (nginx's "client closed request") when the client left
# before its answer was complete; IN_FLIGHT (0) for a request whose gateway process stopped (kill -9, a crash)
# before it recorded how the request ended, charged at its reservation's estimate (gateway/ledger/budget.py)
CLIENT_CLOSED = 499
IN_FLIGHT = 0


def key_id(key: str) -> str:
    """The stored identity of an API key: a short sha256 prefix, never the key."""
    return "k_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


@dataclass
class UpstreamCall:
    model: str
    route: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    cached_tokens: int = 0  # prompt tokens the provider served from its prompt cache (part of prompt_tokens)
    cache_saving_usd: float = 0.0  # cost at the uncached input price minus the cost charged
    unpriced: bool = False  # no price known for the model: its cost_usd of 0 is not a real price (migration 006)
    # prompt tokens the provider wrote to its prompt cache (Anthropic); not a column: read in-process to learn which
    # upstreams cache (gateway.routing.warm_cache)
    cache_write_tokens: int = 0
    # charged at the request's estimate, the provider's usage never having arrived (a client that left); not a
    # column: the leg's error says so in the ledger
    estimated: bool = False


@dataclass
class RequestRecord:
    id: str
    created_at: float
    key_id: str | None
    policy: str | None
    alias: str | None
    route: str | None
    reason: str | None
    status: int
    error: str | None = None
    stream: bool = False
    latency_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    context_tokens: int = 0
    counterfactual_cost_usd: float = 0.0
    provenance: dict[str, Any] | None = None
    calls: list[UpstreamCall] = field(default_factory=list)
    cached_tokens: int = 0  # the legs' sums (migration 005)
    cache_saving_usd: float = 0.0
    # the client's own X-Request-Id when it sent a valid one (migration 012); `id` stays the gateway's, unique
    client_request_id: str | None = None
    # what the router learns from (migration 010): the request_features row (gateway.routing.learning.features_record)
    # and labels this record produced (a judge request's verdict on another request); written with the request
    features: dict[str, Any] | None = None
    labels: list[LabelRecord] = field(default_factory=list)


@dataclass
class LabelRecord:
    """A label of one routed request's cheap answer (migration 010): was it good enough, by whom, at what cost."""

    request_id: str
    source: str  # LABEL_SOURCES
    good: bool
    verdict: str | None = None
    key_id: str | None = None
    score: float | None = None
    cost_usd: float = 0.0
    label_request_id: str | None = None
    created_at: float = field(default_factory=time.time)


# where a label came from: the judge on an escalation (both answers existed), a shadow long answer and the judge,
# or the client's own feedback (POST /v1/feedback)
LABEL_JUDGE, LABEL_SHADOW, LABEL_FEEDBACK = "judge", "shadow", "feedback"
LABEL_SOURCES = (LABEL_JUDGE, LABEL_SHADOW, LABEL_FEEDBACK)


# the columns of the requests and upstream_calls tables, in table order (migrations 001, 005 and 012)
REQUEST_COLUMNS = (
    "id",
    "created_at",
    "key_id",
    "policy",
    "alias",
    "route",
    "reason",
    "status",
    "error",
    "stream",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "context_tokens",
    "counterfactual_cost_usd",
    "provenance",
    "cached_tokens",
    "cache_saving_usd",
    "client_request_id",
)
CALL_COLUMNS = (
    "request_id",
    "created_at",
    "model",
    "route",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "latency_ms",
    "error",
    "cached_tokens",
    "cache_saving_usd",
    "unpriced",
)
FEATURE_COLUMNS = ("request_id", "created_at", "version", "data")
LABEL_COLUMNS = (
    "request_id",
    "created_at",
    "source",
    "key_id",
    "verdict",
    "good",
    "score",
    "cost_usd",
    "label_request_id",
)
# what reports list: provenance only on request detail; a leg without its request id
REQUEST_FIELDS_STORED = tuple(c for c in REQUEST_COLUMNS if c != "provenance")
CALL_FIELDS = tuple(c for c in CALL_COLUMNS if c != "request_id")


@dataclass(frozen=True)
class Measure:
    """One summed figure of the rollup tables (migrations 002, 003, 008): its rollup column and how one raw row
    (a request or a leg) contributes to it. `kind`: "rows" (1 a row), "sum" (the column's value), "sum_present"
    (the value, 0 when null), "present" (1 when the column is not null), "positive" (1 when it is above 0)."""

    column: str
    kind: str
    source: str | None = None  # the raw column it reads; None for "rows"

    def raw_sum(self, prefix: str = "") -> str:
        """The SQL aggregate over raw rows that equals the rollup column's sum (`prefix`: a table alias and dot)."""
        col = f"{prefix}{self.source}"
        return {
            "rows": "count(*)",
            "sum": f"sum({col})",
            "sum_present": f"coalesce(sum({col}), 0)",
            "present": f"count({col})",
            "positive": f"count(CASE WHEN {col} > 0 THEN 1 END)",
        }[self.kind]


# the rollups' figures in their table order (reports read them in this order)
REQUEST_MEASURES = (
    Measure("requests", "rows"),
    Measure("prompt_tokens", "sum", "prompt_tokens"),
    Measure("completion_tokens", "sum", "completion_tokens"),
    Measure("context_tokens", "sum", "context_tokens"),
    Measure("cost_usd", "sum", "cost_usd"),
    Measure("counterfactual_cost_usd", "sum", "counterfactual_cost_usd"),
    Measure("latency_ms_sum", "sum_present", "latency_ms"),
    Measure("latency_count", "present", "latency_ms"),
    # the provider prompt cache (migration 008): hits are requests, or legs, that read prompt tokens from it
    Measure("cache_hits", "positive", "cached_tokens"),
    Measure("cached_tokens", "sum", "cached_tokens"),
    Measure("cache_saving_usd", "sum", "cache_saving_usd"),
)
CALL_MEASURES = (
    Measure("calls", "rows"),
    Measure("errors", "present", "error"),
    Measure("prompt_tokens", "sum", "prompt_tokens"),
    Measure("completion_tokens", "sum", "completion_tokens"),
    Measure("cost_usd", "sum", "cost_usd"),
    Measure("latency_ms_sum", "sum_present", "latency_ms"),
    Measure("latency_count", "present", "latency_ms"),
    Measure("cache_hits", "positive", "cached_tokens"),
    Measure("cached_tokens", "sum", "cached_tokens"),
    Measure("cache_saving_usd", "sum", "cache_saving_usd"),
)


def insert_sql(table: str, columns: tuple[str, ...], verb: str = "INSERT") -> str:
    """`verb` INTO table (columns) VALUES (?, ...): the statement for a row in `columns` order."""
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _row(item: Any, columns: tuple[str, ...], **values: Any) -> tuple:
    # getattr, not dataclasses.asdict: asdict deep-copies calls and provenance, ~70 us of GIL time a record
    return tuple(values[c] if c in values else getattr(item, c) for c in columns)


def request_row(record: RequestRecord) -> tuple:
    """The values of a requests row, in REQUEST_COLUMNS order."""
    provenance = json.dumps(record.provenance) if record.provenance is not None else None
    return _row(record, REQUEST_COLUMNS, stream=int(record.stream), provenance=provenance)


def call_rows(record: RequestRecord) -> list[tuple]:
    """The values of the record's upstream_calls rows, in CALL_COLUMNS order."""
    return [_row(c, CALL_COLUMNS, request_id=record.id, unpriced=int(c.unpriced)) for c in record.calls]


def label_row(label: LabelRecord) -> tuple:
    """The values of a labels row, in LABEL_COLUMNS order."""
    return _row(label, LABEL_COLUMNS, good=int(label.good))


def record_from_dict(data: dict[str, Any]) -> RequestRecord:
    """A RequestRecord back from dataclasses.asdict (the dead-letter file's records)."""
    known = set(RequestRecord.__dataclass_fields__)
    call_fields = set(UpstreamCall.__dataclass_fields__)
    label_fields = set(LabelRecord.__dataclass_fields__)
    values = {k: v for k, v in data.items() if k in known and k not in ("calls", "labels")}
    calls = [UpstreamCall(**{k: v for k, v in c.items() if k in call_fields}) for c in data.get("calls") or []]
    labels = [LabelRecord(**{k: v for k, v in item.items() if k in label_fields}) for item in data.get("labels") or []]
    return RequestRecord(**values, calls=calls, labels=labels)
