"""`selfroute costs --by route|model|policy|key|day|hour`: spend, always-long counterfactual and saving per group."""
from __future__ import annotations

import argparse
import json
import sys

HEADER = ("group", "requests", "prompt tok", "completion tok", "cost", "always-long", "saving", "saving %")
CACHE_HEADER = ("cache hits", "cached tok", "cache saved")  # shown when the provider's prompt cache was used


def register(subparsers, parents) -> None:
    from gateway.commands._common import add_filter_arguments

    parser = subparsers.add_parser(
        "costs", parents=parents, help="spend and savings per route, model, policy, key, day or hour",
        description="Request count, tokens, cost, what always-long-context would have cost (context tokens at the "
                    "long model's price plus completion tokens) and the saving, per group. Days and hours are UTC. "
                    "--by model counts upstream calls; savings are per request, so they show as '-' there. When the "
                    "provider's prompt cache served prompt tokens, three more columns: requests (or calls) that hit "
                    "it, cached prompt tokens, and what caching saved (negative: Anthropic's dearer cache writes).")
    parser.add_argument("--by", default="route", choices=["route", "model", "policy", "key", "day", "hour"])
    add_filter_arguments(parser)
    parser.add_argument("--json", action="store_true", help="the report as one JSON document")
    parser.set_defaults(func=run)


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def _row(row: dict, by: str) -> list[str]:
    counterfactual = row["counterfactual_cost_usd"]
    saving = row["saving_usd"]
    share = "-" if not counterfactual or saving is None else f"{100 * saving / counterfactual:.1f}%"
    count = row["calls"] if row["requests"] is None else row["requests"]
    return [str(row["group"] if row["group"] is not None else "-"), f"{count:,}", f"{row['prompt_tokens']:,}",
            f"{row['completion_tokens']:,}", _money(row["cost_usd"]), _money(counterfactual), _money(saving), share]


def _cache_cells(row: dict) -> list[str]:
    return [f"{row['cache_hits']:,}", f"{row['cached_tokens']:,}", _money(row["cache_saving_usd"])]


def run(args: argparse.Namespace) -> int:
    from gateway.ledger import reports
    from gateway.commands._common import print_table, run_report

    def work(conn, filters) -> int:
        report = reports.costs(conn, args.by, filters)
        if args.json:
            json.dump(report, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 0
        header = list(HEADER)
        header[0] = args.by
        if args.by == "model":
            header[1] = "calls"
        rows = [_row(r, args.by) for r in report["groups"]]
        rows.append(_row({**report["total"], "group": "TOTAL"}, args.by))
        if report["total"]["cached_tokens"] or report["total"]["cache_saving_usd"]:
            header += CACHE_HEADER
            for cells, row in zip(rows, [*report["groups"], report["total"]]):
                cells += _cache_cells(row)
        print_table(rows, tuple(header), sys.stdout, right=set(range(1, len(header))))
        return 0

    return run_report(args, work)
