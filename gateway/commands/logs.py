"""`selfroute logs`: recent requests from the ledger, filtered, as a table or JSON lines; --follow tails it."""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any, TextIO

from gateway.commands._common import add_filter_arguments, print_table, run_report

COLUMNS = ("time (UTC)", "alias", "route", "reason", "models", "tokens", "cost", "latency", "status")


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser("logs", parents=parents, help="recent requests from the cost ledger",
                                   description="Recent requests, oldest first: time, alias, route, reason, models, "
                                               "tokens, cost, latency, status.")
    add_filter_arguments(parser)
    parser.add_argument("-n", "--limit", type=int, default=20, help="how many recent requests (default 20)")
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing requests as they are written")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls with --follow")
    parser.set_defaults(func=run)


def _cell(value: Any, width: int) -> str:
    text = "-" if value is None or value == "" else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def format_row(item: dict) -> list[str]:
    latency = item["latency_ms"]
    return [
        datetime.fromtimestamp(item["created_at"], timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        _cell(item["alias"], 20),
        _cell(item["route"], 11),
        _cell(item["reason"], 32),
        _cell("+".join(item["models"]), 40),
        f"{item['prompt_tokens']}/{item['completion_tokens']}",
        f"${item['cost_usd']:.6f}",
        "-" if latency is None else f"{latency:.0f}ms",
        str(item["status"]),
    ]


def _emit(items: list[dict], as_json: bool, header: bool, out: TextIO) -> None:
    if as_json:
        for item in items:
            out.write(json.dumps(item) + "\n")
    elif items:
        print_table([format_row(i) for i in items], COLUMNS if header else None, out, right={5, 6, 7})
    out.flush()


def run(args: argparse.Namespace) -> int:
    from gateway.ledger import reports

    if args.limit < 1 or args.limit > reports.MAX_PAGE:
        print(f"selfroute logs: --limit must be between 1 and {reports.MAX_PAGE}", file=sys.stderr)
        return 2

    def work(conn, filters) -> int:
        start = reports.follow_position(conn)
        page = reports.list_requests(conn, filters, limit=args.limit)
        items = list(reversed(page["data"]))
        _emit(items, args.json, header=True, out=sys.stdout)
        if not items and not args.json and not args.follow:
            print("no requests match", file=sys.stderr)
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
