"""`selfroute logs`: recent requests from the ledger, filtered, as a table or JSON lines; --follow tails it;
`selfroute logs show ID` prints one request in full (every leg, the route and its whole reason, provenance, flags)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from gateway.commands._common import add_filter_arguments, print_table, run_report

# the reason is last and never cut: it is what tells why a request went where it did
COLUMNS = ("time (UTC)", "request id", "alias", "route", "models", "tokens", "cost", "latency", "status", "reason")
EXAMPLES = """examples:
  selfroute logs --answered-by long --since 1h   requests the long model answered (long and rag>long)
  selfroute logs --route 'rag>long' --json        escalations, one JSON object a line
  selfroute logs show req_0123...                 one request in full: legs, reason, provenance, flags
  selfroute logs show my-client-id                by the X-Request-Id the client sent (every request that used it)
"""


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "logs",
        parents=parents,
        help="recent requests from the cost ledger; `logs show ID` for one in full",
        description="Recent requests, oldest first: time, request id (the x-request-id the client got), alias, "
        "route, models, tokens, cost, latency, status and the whole reason. `logs show ID` prints one "
        "request in full, found by the gateway's id or by the client's own X-Request-Id.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("words", nargs="*", metavar="show ID", help="show one request (its id or X-Request-Id)")
    add_filter_arguments(parser)
    parser.add_argument(
        "--answered-by",
        choices=("direct", "rag", "long", "passthrough"),
        default=None,
        help="the route whose model answered: long matches long and the escalations rag>long",
    )
    parser.add_argument("-n", "--limit", type=int, default=20, help="how many recent requests (default 20)")
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing requests as they are written")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls with --follow")
    parser.set_defaults(func=run)


def _cell(value: Any, width: int) -> str:
    text = "-" if value is None or value == "" else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def visible_id(item: dict) -> str:
    """The id the client was given as x-request-id: its own X-Request-Id, else the gateway's."""
    return item.get("client_request_id") or item["id"]


def _time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def format_row(item: dict) -> list[str]:
    latency = item["latency_ms"]
    return [
        _time(item["created_at"]),
        visible_id(item),
        _cell(item["alias"], 20),
        _cell(item["route"], 11),
        _cell("+".join(item["models"]), 40),
        f"{item['prompt_tokens']}/{item['completion_tokens']}",
        f"${item['cost_usd']:.6f}",
        "-" if latency is None else f"{latency:.0f}ms",
        str(item["status"]),
        item["reason"] or "-",
    ]


def _emit(items: list[dict], as_json: bool, header: bool, out: TextIO) -> None:
    if as_json:
        for item in items:
            out.write(json.dumps(item) + "\n")
    elif items:
        print_table([format_row(i) for i in items], COLUMNS if header else None, out, right={5, 6, 7})
    out.flush()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}ms"


def format_detail(item: dict) -> str:
    """One request in full, as `logs show` prints it."""
    lines = [f"request      {visible_id(item)}"]
    if item.get("client_request_id"):
        lines.append(f"gateway id   {item['id']}")
    saving = item["counterfactual_cost_usd"] - item["cost_usd"]
    lines += [
        f"time (UTC)   {_time(item['created_at'])}",
        f"key          {item['key_id'] or '-'}",
        f"policy       {item['policy'] or '-'}",
        f"alias        {item['alias'] or '-'}",
        f"route        {item['route'] or '-'}",
        f"reason       {item['reason'] or '-'}",
        f"status       {item['status']}" + (f" ({item['error']})" if item.get("error") else ""),
        f"stream       {'yes' if item['stream'] else 'no'}",
        f"latency      {_ms(item['latency_ms'])}",
        f"tokens       {item['prompt_tokens']} prompt, {item['completion_tokens']} completion"
        + (f", {item['cached_tokens']} of them from the provider's cache" if item.get("cached_tokens") else ""),
        f"cost         ${item['cost_usd']:.6f}; always-long ${item['counterfactual_cost_usd']:.6f} "
        f"({item['context_tokens']} tokens); saved ${saving:.6f}",
        f"legs         {len(item['calls'])}",
    ]
    for number, leg in enumerate(item["calls"], 1):
        line = (
            f"  {number}. {leg['model']}  route {leg['route'] or '-'}  {leg['prompt_tokens']}/"
            f"{leg['completion_tokens']} tokens  ${leg['cost_usd']:.6f}  {_ms(leg['latency_ms'])}"
        )
        if leg.get("cached_tokens"):
            line += f"  cached {leg['cached_tokens']}"
        if leg.get("unpriced"):
            line += "  unpriced"
        if leg.get("error"):
            line += f"  error: {leg['error']}"
        lines.append(line)
    provenance = dict(item.get("provenance") or {})
    flags = provenance.pop("flags", None)
    lines.append("provenance   " + ("-" if not provenance else ""))
    if provenance:
        lines += ["  " + line for line in json.dumps(provenance, indent=2, ensure_ascii=False).splitlines()]
    lines.append("flags        " + ("-" if not flags else ""))
    if flags:
        lines += ["  " + line for line in json.dumps(flags, indent=2, ensure_ascii=False).splitlines()]
    return "\n".join(lines)


def _show(args: argparse.Namespace, words: list[str]) -> int:
    from gateway.ledger import reports

    if len(words) != 2:
        print("selfroute logs: use `selfroute logs show ID`", file=sys.stderr)
        return 2

    from gateway.ledger.errors import NotFound

    def work(conn, filters) -> int:
        try:
            items = reports.find_requests(conn, words[1])
        except NotFound as error:
            print(f"selfroute logs: {error.message}", file=sys.stderr)
            return 1
        if args.json:
            for item in items:
                sys.stdout.write(json.dumps(item) + "\n")
        else:
            sys.stdout.write("\n\n".join(format_detail(item) for item in items) + "\n")
        return 0

    return run_report(args, work)


def run(args: argparse.Namespace) -> int:
    from gateway.ledger import reports

    words = args.words or []
    if words:
        if words[0] != "show":
            print(
                f"selfroute logs: unknown action {words[0]!r} (did you mean `selfroute logs show ID`?)", file=sys.stderr
            )
            return 2
        return _show(args, words)
    if args.limit < 1 or args.limit > reports.MAX_PAGE:
        print(f"selfroute logs: --limit must be between 1 and {reports.MAX_PAGE}", file=sys.stderr)
        return 2

    def work(conn, filters) -> int:
        start = reports.follow_position(conn)
        page = reports.list_requests(conn, filters, limit=args.limit)
        items = list(reversed(page["data"]))
        _emit(items, args.json, header=True, out=sys.stdout)
        if not items and not args.json and not args.follow:
            hint = " (escalations are route rag>long: --answered-by long matches both)" if args.route == "long" else ""
            print(f"no requests match{hint}", file=sys.stderr)
        if not args.follow:
            return 0
        after = start
        try:
            while True:
                time.sleep(args.interval)
                # write order, not created_at order: a request's row lands when it finishes
                new, after = reports.requests_after(conn, after, filters)
                _emit(new, args.json, header=False, out=sys.stdout)
        except KeyboardInterrupt:
            return 0

    return run_report(args, work)
