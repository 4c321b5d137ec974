"""Helpers several commands share: the ledger commands' (logs, costs, export) filters and tables, the store
options, and the replay commands' (eval replay, calibrate) prompt-cache options. The `_` keeps the CLI from
taking it for a subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def add_ledger_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ledger-url",
        default=None,
        help="the cost ledger: a SQLite file path or postgresql://user:pass@host/db "
        "(default: $SELFROUTE_LEDGER_URL, else DATA_DIR/ledger.sqlite3)",
    )


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    add_ledger_argument(parser)  # every command that filters the ledger reads it
    group = parser.add_argument_group("filters")
    group.add_argument("--route", help="direct | rag | long | rag>long | passthrough | none (quote rag>long)")
    group.add_argument("--key", help="a named key's name, or a key id as stored (k_...); a raw key is hashed first")
    group.add_argument("--policy", help="policy name")
    group.add_argument("--status", help="HTTP status: 200, 4xx, ok (<400) or error (>=400)")
    group.add_argument("--since", help="ISO date/time (UTC if no zone) or an age: 30m, 1h, 7d")
    group.add_argument("--until", help="ISO date/time (UTC if no zone) or an age: 30m, 1h, 7d (exclusive)")


def filters_from_args(args: argparse.Namespace):
    from dataclasses import replace

    from gateway.ledger.keys import KeyStore
    from gateway.ledger.reports import Filters

    filters = Filters.parse(
        since=args.since,
        until=args.until,
        route=args.route,
        key=args.key,
        policy=args.policy,
        status=args.status,
        answered_by=getattr(args, "answered_by", None),
    )
    location = ledger_location(args)
    if args.key and ledger_exists(location):  # a named key is recorded by its name, not a hash
        store = KeyStore(location)
        try:
            if store.exists(args.key.strip()):
                filters = replace(filters, key=args.key.strip())
        finally:
            store.close()
    return filters


def ledger_exists(location) -> bool:
    from pathlib import Path

    from gateway.ledger.dialect import is_postgres

    return is_postgres(location) or Path(location).exists()


def ledger_location(args: argparse.Namespace):
    """--ledger-url, else $SELFROUTE_LEDGER_URL, else the SQLite file in the data directory."""
    from gateway.ledger.records import LEDGER_FILE
    from gateway.settings import resolve_data_dir, resolve_ledger_url

    return resolve_ledger_url(getattr(args, "ledger_url", None)) or resolve_data_dir(args.data_dir) / LEDGER_FILE


def run_report(args: argparse.Namespace, work) -> int:
    """Open the ledger read-only, run `work(conn, filters)`; the ledger's errors become a message and exit status."""
    from gateway.ledger import reports
    from gateway.ledger.errors import LedgerError, NotFound

    try:
        filters = filters_from_args(args)
        location = ledger_location(args)
        reports.ensure_schema(location)
        conn = reports.connect_reader(location)
    except LedgerError as error:
        print(f"selfroute {args.command}: {error.message}", file=sys.stderr)
        return 1 if isinstance(error, NotFound) else 2
    try:
        return work(conn, filters)
    except LedgerError as error:
        print(f"selfroute {args.command}: {error.message}", file=sys.stderr)
        return 2
    finally:
        conn.close()


def print_table(rows: list[list[str]], header: tuple[str, ...] | None, out: TextIO, right: set[int]) -> None:
    table = ([list(header)] if header else []) + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))] if table else []
    for row in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.write("  ".join(cells).rstrip() + "\n")


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store-uri",
        default=None,
        help="LanceDB URI for collections, e.g. s3://bucket/selfroute (default: $SELFROUTE_STORE_URI, "
        "else DATA_DIR/lancedb)",
    )
    parser.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="policy whose rag settings (chunking, embedding model) apply (default: the shipped one)",
    )


def open_store(args: argparse.Namespace, policy):
    """The document store the gateway would use with these --data-dir/--store-uri flags (the embedding model
    loads only when something is embedded)."""
    from gateway.settings import Settings, resolve_data_dir
    from pipelines.embedding import Embedder
    from pipelines.store import DocumentStore

    settings = Settings(data_dir=resolve_data_dir(args.data_dir))
    if args.store_uri:
        settings.vector_store_uri = args.store_uri
    rag = policy.rag
    return DocumentStore(
        settings.store_uri,
        Embedder(
            rag.embedding_model,
            batch_size=rag.embedding_batch_size,
            backend=rag.embedding_backend,
        ),
        rag,
    )


def _cache_prices(text: str) -> tuple[float, float | None]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected READ or READ,WRITE in USD per million tokens (>= 0), got {text!r}")
    return values[0], values[1] if len(values) == 2 else None


def whole_number(what: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= 1 of `what` (questions, workers), or a clear usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a whole number of {what} >= 1, got {text!r}")
        return value

    return parse


def add_cache_arguments(parser) -> None:
    """The replay's provider prompt-cache options (gateway.evaluation.replay.LongCache)."""
    parser.add_argument(
        "--prompt-cache",
        choices=["off", "on"],
        default="off",
        help="price long legs with the long model's provider prompt cache: a document's block is "
        "written by the first long leg on it and read by the next ones (items in file order); "
        "rates from the policy's long model (its cached_input / cache_write prices, else "
        "litellm's cost map). Default off",
    )
    parser.add_argument(
        "--long-cache-prices",
        type=_cache_prices,
        default=None,
        metavar="READ[,WRITE]",
        help="the long model's cache rates in USD per million tokens (implies --prompt-cache on): "
        "READ for cached prompt tokens; WRITE when the provider charges for writing the block "
        "(Anthropic: 1.25x input), none for automatic caching (OpenAI)",
    )
    parser.add_argument(
        "--cache-window",
        type=whole_number("questions"),
        default=None,
        metavar="N",
        help="a document's cache stays warm for N questions after its last long leg (default: the "
        "whole replay is one session)",
    )


def cache_options(args: argparse.Namespace) -> dict:
    """resolve_prices' keyword arguments from add_cache_arguments' options."""
    return {
        "prompt_cache": args.prompt_cache == "on",
        "long_cache_prices": args.long_cache_prices,
        "cache_window": args.cache_window,
    }


def print_relative(card: dict[str, Any]) -> None:
    """The relative rule's choice (gateway.evaluation.tradeoff.relative_choice_card) as train and calibrate print it."""
    print(f"relative rule (routing.verifier.relative): {card['described']}, chosen on every unit")
    for unit, f in card["per_unit"].items():
        print(f"  on {unit}: {_span(f)}")
    for unit, f in card["held_out"].items():
        print(f"  held out {unit} (chosen on the others: {f['settings']}): {_span(f)}")
    if not card["held_out"]:
        print("  held out: one unit only, nothing to hold out (the choice is in-sample)")
        return
    print(
        f"  held out: both targets met on {card['held_out_both_targets']} of {len(card['held_out'])} units, worst "
        f"gap {card['held_out_worst_gap_points']:+.2f} points"
    )


def _span(f: dict[str, Any]) -> str:
    gap, tokens = f["vs_better_baseline_points"], f["tokens_vs_long"]
    return (
        f"{gap[0]:+.2f}..{gap[1]:+.2f} points vs the better baseline at {tokens[0]:.3f}..{tokens[1]:.3f} of "
        f"always-long's tokens ({'within 1 point' if f['within_1_point'] else 'missed'}); Self-Route "
        + ("beaten" if f["beats_self_route"] else "not beaten at no more tokens")
    )
