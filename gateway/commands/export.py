"""`selfroute export --format csv|jsonl`: the ledger's requests, oldest first, for spreadsheets or other tools.

jsonl: one request a line with its upstream legs and provenance. csv: one request a row; `models` joins the
legs' models with '+', `provenance` is a JSON string.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys

CSV_EXTRA = ("models", "legs", "provenance")


def register(subparsers, parents) -> None:
    from gateway.commands._common import add_filter_arguments

    parser = subparsers.add_parser("export", parents=parents, help="export ledger requests as CSV or JSON lines")
    parser.add_argument("--format", choices=["csv", "jsonl"], default="jsonl")
    parser.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    add_filter_arguments(parser)
    parser.set_defaults(func=run)


def write_export(items, fmt: str, out) -> int:
    from gateway.ledger.reports import REQUEST_COLUMNS

    count = 0
    if fmt == "jsonl":
        for item in items:
            out.write(json.dumps(item) + "\n")
            count += 1
        return count
    writer = csv.writer(out)
    writer.writerow([*REQUEST_COLUMNS, *CSV_EXTRA])
    for item in items:
        provenance = json.dumps(item["provenance"]) if item["provenance"] is not None else ""
        writer.writerow([*("" if item[c] is None else item[c] for c in REQUEST_COLUMNS),
                         "+".join(call["model"] for call in item["calls"]), len(item["calls"]), provenance])
        count += 1
    return count


def run(args: argparse.Namespace) -> int:
    from gateway.ledger import reports
    from gateway.commands._common import run_report

    def work(conn, filters) -> int:
        items = reports.iter_export(conn, filters)
        if args.output == "-":
            count = write_export(items, args.format, sys.stdout)
        else:
            with open(args.output, "w", encoding="utf-8", newline="") as out:
                count = write_export(items, args.format, out)
        print(f"exported {count} requests", file=sys.stderr)
        return 0

    return run_report(args, work)
