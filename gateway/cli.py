"""The `selfroute` command line: discovers subcommands in gateway.commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

import gateway.commands
from gateway.settings import package_version

DATA_DIR_HELP = "where the ledger, vector store and caches live (default: $SELFROUTE_DATA_DIR, else ~/.selfroute)"


class _Parser(argparse.ArgumentParser):
    """A command's parser reads options and positionals in any order (`ingest NAME --no-progress PATH`, even when
    NAME and PATH are optional); a parser with subcommands parses as argparse always does."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing or any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back into parse_known_args
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _common_parser(*, defaults: bool) -> argparse.ArgumentParser:
    """--data-dir and --log-level. The top-level parser holds the defaults; subcommands SUPPRESS theirs, so a value
    given before the subcommand (`selfroute --data-dir X logs`) is not overwritten by a subcommand's default."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=None if defaults else argparse.SUPPRESS, help=DATA_DIR_HELP)
    common.add_argument(
        "--log-level",
        default=os.environ.get("SELFROUTE_LOG_LEVEL", "INFO") if defaults else argparse.SUPPRESS,
        help="DEBUG, INFO, WARNING or ERROR (default: $SELFROUTE_LOG_LEVEL, else INFO)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="selfroute",
        description="Hybrid routing gateway: cheap RAG or long context per request, with Self-Route fallback.",
        parents=[_common_parser(defaults=True)],
    )
    parser.add_argument("--version", action="version", version=f"selfroute {package_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    parents = [_common_parser(defaults=False)]
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


# libraries whose INFO lines (model loading, HTTP requests, table opens) are noise in a command's output
THIRD_PARTY_LOGGERS = (
    "sentence_transformers",
    "transformers",
    "huggingface_hub",
    "httpx",
    "httpcore",
    "LiteLLM",
    "litellm",
    "lancedb",
    "urllib3",
    "filelock",
    "aiohttp",
    "botocore",
    "asyncio",
)


def quiet_third_parties(level: int) -> None:
    """Below DEBUG, third-party INFO logs and weight-loading progress bars are silenced (a command's own progress
    bar, `ingest`'s, is not theirs). Set before the libraries are imported: they read the variables at import."""
    if level <= logging.DEBUG:
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # huggingface_hub's and transformers' tqdm bars
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def _quiet_broken_pipe() -> int:
    """The reader went away (`selfroute export | head`): what is still buffered has nowhere to go. Point stdout
    at /dev/null so the interpreter's final flush does not raise again, and exit like a program killed by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass
    return 141


def main(argv: list[str] | None = None) -> int:
    configure_environment()
    args = build_parser().parse_args(argv)
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_third_parties(level)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        return _quiet_broken_pipe()


if __name__ == "__main__":
    sys.exit(main())
