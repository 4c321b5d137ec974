"""`selfroute costs --by route|model|policy|key|day|week|hour`: spend, always-long counterfactual and saving per
group."""

from __future__ import annotations

import argparse
import json
import sys

HEADER = (
    "group",
    "requests",
    "prompt tok",
    "completion tok",
    "cost",
    "always-long",
    "saving",
    "saving %",
    "tok saved",
    "tok saved %",
)
CACHE_HEADER = ("cache hits", "cached tok", "cache saved")  # shown when the provider's prompt cache was used


def register(subparsers, parents) -> None:
    from gateway.commands._common import add_filter_arguments

    parser = subparsers.add_parser(
        "costs",
        parents=parents,
        help="spend and savings per route, model, policy, key, day, week, hour or tag",
        description="Request count, tokens, cost, what always-long-context would have cost (context tokens at the "
        "long model's price plus completion tokens) and the saving, per group. Days, ISO weeks "
        "(2026-W49: Monday to Sunday) and hours are UTC. "
        "'tok saved' is prompt tokens: what always-long would have sent (capped at the long model's window) "
        "less what was sent, meaningful at any price. --by model counts upstream calls; savings are per "
        "request, so they show as '-' there. Models with no known price are marked 'unpriced': their "
        "calls are counted at $0. When the provider's prompt cache served prompt tokens, three more "
        "columns: requests (or calls) that hit it, cached prompt tokens, and what caching saved "
        "(negative: Anthropic's dearer cache writes).",
        epilog="examples:\n"
        "  selfroute costs                                 # per route, all time\n"
        "  selfroute costs --by week --since 30d\n"
        "  selfroute costs --by key --since 2026-11-01 --until 2026-12-01\n"
        "  selfroute costs --by model --json\n"
        "  selfroute costs --by tag --since 7d",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--by",
        default="route",
        choices=["route", "model", "policy", "key", "day", "week", "hour", "tag"],
        help="tag: the requests' metadata.tags (a request with two tags counts under both)",
    )
    add_filter_arguments(parser)
    parser.add_argument("--json", action="store_true", help="the report as one JSON document")
    parser.set_defaults(func=run)


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def _percent(part: float | None, whole: float | None) -> str:
    return "-" if not whole or part is None else f"{100 * part / whole:.1f}%"


def _row(row: dict, by: str, unpriced: set[str]) -> list[str]:
    counterfactual = row["counterfactual_cost_usd"]
    count = row["calls"] if row["requests"] is None else row["requests"]
    group = str(row["group"] if row["group"] is not None else "-")
    cost = _money(row["cost_usd"])
    if by == "model" and row["group"] in unpriced:
        group, cost = f"{group} (unpriced)", "unpriced"
    saved = row.get("saved_tokens")
    return [
        group,
        f"{count:,}",
        f"{row['prompt_tokens']:,}",
        f"{row['completion_tokens']:,}",
        cost,
        _money(counterfactual),
        _money(row["saving_usd"]),
        _percent(row["saving_usd"], counterfactual),
        "-" if saved is None else f"{saved:,}",
        _percent(saved, row.get("always_long_tokens")),
    ]


def _cache_cells(row: dict) -> list[str]:
    return [f"{row['cache_hits']:,}", f"{row['cached_tokens']:,}", _money(row["cache_saving_usd"])]


def _unpriced_notes(report: dict) -> None:
    for item in report["unpriced_models"]:
        print(
            f"unpriced: {item['model']} has no known price; its {item['calls']:,} calls "
            f"({item['prompt_tokens'] + item['completion_tokens']:,} tokens) are counted at $0. Set "
            "input_cost_per_mtok / output_cost_per_mtok in the policy."
        )


def run(args: argparse.Namespace) -> int:
    from gateway.commands._common import print_table, run_report
    from gateway.ledger import reports

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
        unpriced = {u["model"] for u in report["unpriced_models"]}
        rows = [_row(r, args.by, unpriced) for r in report["groups"]]
        rows.append(_row({**report["total"], "group": "TOTAL"}, args.by, unpriced))
        total = report["total"]
        if total["requests"] and not total["cost_usd"] and not total["counterfactual_cost_usd"]:
            # nothing priced above $0 (the embedded default's local models): tokens saved first, no $0 columns
            keep = [0, 1, 2, 3, 8, 9]
            print_table(
                [[r[i] for i in keep] for r in rows],
                tuple(header[i] for i in keep),
                sys.stdout,
                right=set(range(1, len(keep))),
            )
            print(
                "no spend priced above $0 here (local models are free): dollar columns left out; 'tok saved' is "
                "the prompt tokens always-long would have sent less those sent"
            )
            _unpriced_notes(report)
            return 0
        if report["total"]["cached_tokens"] or report["total"]["cache_saving_usd"]:
            header += CACHE_HEADER
            for cells, row in zip(rows, [*report["groups"], report["total"]]):
                cells += _cache_cells(row)
        print_table(rows, tuple(header), sys.stdout, right=set(range(1, len(header))))
        _unpriced_notes(report)
        return 0

    return run_report(args, work)
