"""`selfroute export --format csv|jsonl`: the ledger's requests, oldest first, for spreadsheets or other tools.

jsonl: one request a line with its upstream legs and provenance, times as epoch seconds. csv: one request a row of
flat cells for spreadsheets: `created_at` in ISO 8601 (UTC), `models` joins the legs' models with '+'; the
provenance (which chunks were sent: kilobytes a row) only with --with-provenance, as a JSON string.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import UTC, datetime

CSV_EXTRA = ("models", "legs")


def register(subparsers, parents) -> None:
    from gateway.commands._common import add_filter_arguments

    parser = subparsers.add_parser("export", parents=parents, help="export ledger requests as CSV or JSON lines")
    parser.add_argument("--format", choices=["csv", "jsonl"], default="jsonl")
    parser.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    parser.add_argument(
        "--with-provenance", action="store_true", help="csv: add the provenance column (JSON); jsonl always has it"
    )
    add_filter_arguments(parser)
    parser.set_defaults(func=run)


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _csv_cell(name: str, value) -> object:
    if value is None:
        return ""
    if name == "created_at":
        return iso_time(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def write_export(items, fmt: str, out, with_provenance: bool = False) -> int:
    from gateway.ledger.records import REQUEST_FIELDS_STORED

    count = 0
    if fmt == "jsonl":
        for item in items:
            out.write(json.dumps(item) + "\n")
            count += 1
        return count
    writer = csv.writer(out)
    writer.writerow([*REQUEST_FIELDS_STORED, *CSV_EXTRA, *(["provenance"] if with_provenance else [])])
    for item in items:
        row = [
            *(_csv_cell(c, item[c]) for c in REQUEST_FIELDS_STORED),
            "+".join(call["model"] for call in item["calls"]),
            len(item["calls"]),
        ]
        if with_provenance:
            row.append(json.dumps(item["provenance"]) if item["provenance"] is not None else "")
        writer.writerow(row)
        count += 1
    return count


def run(args: argparse.Namespace) -> int:
    from gateway.commands._common import run_report
    from gateway.ledger import reports

    def work(conn, filters) -> int:
        items = reports.iter_export(conn, filters)
        if args.output == "-":
            count = write_export(items, args.format, sys.stdout, args.with_provenance)
        else:
            with open(args.output, "w", encoding="utf-8", newline="") as out:
                count = write_export(items, args.format, out, args.with_provenance)
        print(f"exported {count} requests", file=sys.stderr)
        return 0

    return run_report(args, work)
