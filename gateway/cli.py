"""The `selfroute` command line: discovers subcommands in gateway.commands."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

import gateway.commands


def _common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        default=None,
        help="where the ledger, vector store and caches live (default: $SELFROUTE_DATA_DIR, else ~/.selfroute)",
    )
    common.add_argument("--log-level", default=os.environ.get("SELFROUTE_LOG_LEVEL", "INFO"))
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="selfroute",
        description="Hybrid routing gateway: cheap RAG or long context per request, with Self-Route fallback.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    parents = [_common_parser()]
    for info in sorted(pkgutil.iter_modules(gateway.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # shared helpers, not a subcommand
            continue
        module = importlib.import_module(f"gateway.commands.{info.name}")
        module.register(subparsers, parents)
    return parser


def configure_environment() -> None:
    # Offline by default: never let a library reach for a hub or a remote cost map.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    configure_environment()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
