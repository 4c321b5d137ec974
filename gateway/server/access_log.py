"""The access log: one line per HTTP request on the `selfroute.access` logger, plain text or JSON
(`selfroute serve --log-format json`, which makes every log line JSON).

A line names the request (its x-request-id, and the gateway's own id when they differ), the method and path
(never the query string: the dashboard's URL may carry the admin key), the status, the latency and, for a
ledgered request, the key's name (or stored id), the model alias asked for, the route, the tokens and the cost.
Never the prompt, the answer or any header value. Lines are INFO: `--log-level WARNING` or `--no-access-log`
turns them off."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.types import Scope

if TYPE_CHECKING:
    from gateway.ledger.records import RequestRecord

ACCESS_LOGGER = "selfroute.access"
LOG_FORMATS = ("plain", "json")
# the attributes every LogRecord has: whatever else a record carries was passed as `extra` and goes into JSON
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class AccessLog:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.logger = logging.getLogger(ACCESS_LOGGER)

    def active(self) -> bool:
        return self.enabled and self.logger.isEnabledFor(logging.INFO)

    def emit(
        self,
        scope: Scope,
        status: int,
        latency_ms: float,
        gateway_id: str,
        client_id: str | None,
        record: RequestRecord | None,
    ) -> None:
        fields = access_fields(scope, status, latency_ms, gateway_id, client_id, record)
        self.logger.info(plain_line(fields), extra={"access": fields})


def access_fields(
    scope: Scope, status: int, latency_ms: float, gateway_id: str, client_id: str | None, record: RequestRecord | None
) -> dict[str, Any]:
    client = scope.get("client")
    fields: dict[str, Any] = {
        "request_id": client_id or gateway_id,
        "method": scope["method"],
        "path": scope["path"],
        "status": status,
        "latency_ms": round(latency_ms, 1),
        "client": client[0] if client else None,
    }
    if client_id:
        fields["selfroute_id"] = gateway_id
    if record is not None:
        if record.status and record.status != status:  # a stream that failed after its 200 went out, a 499
            fields["ledger_status"] = record.status
        fields.update(
            key=record.key_id,
            alias=record.alias,
            route=record.route,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            cost_usd=round(record.cost_usd, 8),
        )
    return fields


def plain_line(fields: dict[str, Any]) -> str:
    line = f"{fields['request_id']} {fields['method']} {fields['path']} {fields['status']} {fields['latency_ms']:.0f}ms"
    if "ledger_status" in fields:
        line += f" (ended {fields['ledger_status']})"
    if "route" in fields:
        line += (
            f" key={fields['key'] or '-'} alias={fields['alias'] or '-'} route={fields['route'] or '-'}"
            f" tokens={fields['prompt_tokens']}/{fields['completion_tokens']} cost=${fields['cost_usd']:.6f}"
        )
    return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and an access line's fields at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        item: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        access = getattr(record, "access", None)
        if access is not None:
            item.update(access)
        else:
            item["message"] = record.getMessage()
            for name, value in vars(record).items():
                if name not in _STANDARD_ATTRS and name != "access":
                    item[name] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            item["exception"] = self.formatException(record.exc_info)
        return json.dumps(item, default=str)


def configure_logging(level: str, log_format: str = "plain") -> None:
    """The process's logging: plain lines (the CLI's format) or JSON lines, at `level`, on stderr."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO), handlers=[handler], force=True)
