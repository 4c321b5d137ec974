"""`selfroute serve`: run the gateway under uvicorn, in one process or several workers."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# how the parent hands its settings to worker processes, which build their own app (uvicorn's factory)
WORKER_SETTINGS_ENV = "SELFROUTE_WORKER_SETTINGS"
DEFAULT_SHUTDOWN_TIMEOUT = 15.0
# a connection's request line and headers must arrive within this many seconds of the connection opening (or of the
# previous response on a kept-alive connection); uvicorn has no such deadline, so a client that opens connections
# and sends nothing, or a header a byte at a time, holds them for ever
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5  # idle seconds between requests on a kept-alive connection (uvicorn's own default)
DEFAULT_BODY_TIMEOUT = 30.0  # the whole body, once the headers are in (gateway.server.bodies)


def register(subparsers, parents) -> None:
    from gateway.commands._common import add_ledger_argument

    parser = subparsers.add_parser(
        "serve",
        parents=parents,
        help="run the OpenAI-compatible gateway",
        description="Run the gateway. At start-up it prints the effective limits: each model's window, output limit, "
        "prices, timeout, and what the long, direct and rag routes pack.",
        epilog="examples:\n"
        "  selfroute serve                                   # the embedded default on 127.0.0.1:8000\n"
        "  selfroute serve --cheap-model openai/gpt-4o-mini --long-model openai/gpt-4.1\n"
        "  selfroute serve --long-model hosted_vllm/qwen2.5-72b --long-window 32768\n"
        "  selfroute serve --policy policies/hosted-example.yaml --host 0.0.0.0 --workers 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_ledger_argument(parser)  # replicas share a PostgreSQL ledger: --ledger-url postgresql://...
    parser.add_argument(
        "--store-uri",
        default=None,
        help="LanceDB URI for collections, e.g. s3://bucket/selfroute (default: $SELFROUTE_STORE_URI, "
        "else DATA_DIR/lancedb)",
    )
    parser.add_argument("--policy", type=Path, default=None, help="routing policy YAML (default: the shipped default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    add_model_override_arguments(parser)
    parser.add_argument("--keys-file", type=Path, default=None, help="API keys, one a line (also $SELFROUTE_API_KEYS)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes sharing the port, the ledger and the document store (default 1)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT,
        help="seconds a connection may take to send a request's line and headers, from opening or "
        f"from the previous response (default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=int,
        default=DEFAULT_KEEP_ALIVE_TIMEOUT,
        help=f"idle seconds a kept-alive connection stays open (default {DEFAULT_KEEP_ALIVE_TIMEOUT})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        help="seconds a request's whole body may take to arrive once its headers are in; later is "
        f"a 408 body_timeout (default {DEFAULT_BODY_TIMEOUT:g})",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT,
        help="on SIGTERM or Ctrl-C: seconds in-flight requests may take to finish before they are "
        f"cancelled (and ledgered); then the ledger is flushed and the process exits "
        f"(default {DEFAULT_SHUTDOWN_TIMEOUT:g})",
    )
    parser.add_argument(
        "--log-format",
        choices=("plain", "json"),
        default="plain",
        help="plain log lines, or one JSON object a line for every log line, access lines included (default plain)",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry traces over OTLP/HTTP (the otel extra; OTEL_EXPORTER_OTLP_ENDPOINT etc. "
        "configure it, and setting one turns tracing on without this flag)",
    )
    parser.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no access-log line per request (they are INFO lines: --log-level WARNING hides them too)",
    )
    parser.add_argument(
        "--preload",
        action="store_true",
        help="load the in-process models (embedding session, local model) before readiness, not at the first "
        "request that uses them (a warm first request, ~270 MB more at idle for the shipped default)",
    )
    parser.set_defaults(func=run)


def add_model_override_arguments(parser: argparse.ArgumentParser) -> None:
    """--cheap-model / --long-model and their windows (serve, and policy check to preview them)."""
    parser.add_argument(
        "--cheap-model",
        default=None,
        help="replace the policy's cheap model (litellm model string): its window, output limit and "
        "prices come from litellm's model information, the RAG budget from its class",
    )
    parser.add_argument(
        "--long-model",
        default=None,
        help="replace the policy's long model (litellm model string): the long route packs its "
        "window less the answer reserve",
    )
    parser.add_argument(
        "--cheap-window",
        type=_window,
        default=None,
        metavar="TOKENS",
        help="the --cheap-model's context window, for a model litellm does not know",
    )
    parser.add_argument(
        "--long-window",
        type=_window,
        default=None,
        metavar="TOKENS",
        help="the --long-model's context window, for a model litellm does not know",
    )


def override_problem(args: argparse.Namespace) -> str | None:
    for role in ("cheap", "long"):
        if getattr(args, f"{role}_window") and not getattr(args, f"{role}_model"):
            return (
                f"--{role}-window goes with --{role}-model (a policy gives its models' windows as "
                f"{role}.context_window)"
            )
    return None


def _window(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        value = 0
    if value < 256:
        raise argparse.ArgumentTypeError(f"expected a context window of at least 256 tokens, got {text!r}")
    return value


def _settings(values: dict):
    from gateway.settings import Settings

    settings = Settings(
        data_dir=Path(values["data_dir"]),
        policy_path=Path(values["policy_path"]) if values["policy_path"] else None,
        cheap_model=values["cheap_model"],
        long_model=values["long_model"],
        cheap_window=values.get("cheap_window"),
        long_window=values.get("long_window"),
        keys_file=Path(values["keys_file"]) if values["keys_file"] else None,
    )
    if values["store_uri"]:
        settings.vector_store_uri = values["store_uri"]
    if values.get("ledger_url"):
        settings.ledger_url = values["ledger_url"]
    settings.access_log = values.get("access_log", True)
    settings.preload = values.get("preload", False)
    return settings


def _set_deadlines(values: dict) -> None:
    """This process's header and body deadlines (a worker process sets its own from the parent's values)."""
    from gateway.commands import _http_deadline
    from gateway.server import bodies

    _http_deadline.HEADER_TIMEOUT_S = values.get("header_timeout", DEFAULT_HEADER_TIMEOUT)
    bodies.BODY_READ_TIMEOUT_S = values.get("body_timeout", DEFAULT_BODY_TIMEOUT)


def worker_app():
    """The app of one worker process (uvicorn calls this factory in each worker)."""
    from gateway.server.access_log import configure_logging
    from gateway.server.app import create_app

    values = json.loads(os.environ[WORKER_SETTINGS_ENV])
    _set_deadlines(values)
    configure_logging(values["log_level"], values["log_format"])  # a spawned worker starts with no logging set up
    if values.get("otel"):
        from gateway import tracing

        tracing.configure()  # each worker its own exporter
    return create_app(_settings(values))


def _fresh_multiprocess_dir(data_dir: Path) -> Path:
    """An empty directory for the workers' metric files (prometheus_client's multiprocess mode): emptied at every
    start, as that mode requires, so counts begin at zero with the processes, like a single process's."""
    import shutil

    from gateway.settings import private_dir

    path = private_dir(data_dir) / "metrics"
    shutil.rmtree(path, ignore_errors=True)
    return private_dir(path)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.ledger.dialect import database_error_types
    from gateway.routing.model_files import check_policy_files
    from gateway.server.app import create_app
    from gateway.settings import resolve_data_dir
    from policies.loader import PolicyError

    if args.workers < 1:
        print("selfroute serve: --workers must be at least 1", file=sys.stderr)
        return 2
    problem = override_problem(args)
    if problem:
        print(f"selfroute serve: {problem}", file=sys.stderr)
        return 2
    values = {
        "data_dir": str(resolve_data_dir(args.data_dir)),
        "policy_path": str(args.policy) if args.policy else None,
        "cheap_model": args.cheap_model,
        "long_model": args.long_model,
        "cheap_window": args.cheap_window,
        "long_window": args.long_window,
        "keys_file": str(args.keys_file) if args.keys_file else None,
        "store_uri": args.store_uri,
        "ledger_url": args.ledger_url,
        "access_log": args.access_log,
        "preload": args.preload,
        "log_level": str(args.log_level),
        "log_format": args.log_format,
    }
    from gateway.server.access_log import configure_logging

    configure_logging(args.log_level, args.log_format)
    from gateway import tracing

    values["otel"] = tracing.wanted(args.otel)
    if values["otel"]:
        try:
            tracing.configure()
        except tracing.TracingUnavailable as exc:
            print(f"selfroute serve: {exc}", file=sys.stderr)
            return 2
    settings = _settings(values)
    errors, _ = database_error_types()
    try:
        app = create_app(settings)  # validates the policy once, with a readable error, and migrates the ledger
    except PolicyError as exc:
        print(f"selfroute serve: invalid policy: {exc}", file=sys.stderr)
        return 2
    except errors as exc:  # the password of a postgresql:// URL is already taken out of the driver's message
        print(f"selfroute serve: cannot open the ledger database: {exc}".strip(), file=sys.stderr)
        return 2
    gateway = app.state.gateway
    # the files the policy names load at start-up, inside uvicorn: a missing one would end in a traceback there
    problems = check_policy_files(gateway.policy, gateway.policy_path)
    for problem in problems:
        print(f"selfroute serve: invalid policy: {gateway.policy_path or 'default'}: {problem}", file=sys.stderr)
    if problems:
        return 2
    print(
        f"selfroute: data in {settings.data_dir}; policy {app.state.gateway.policy.name!r}; {args.workers} worker(s)",
        flush=True,
    )
    for line in app.state.limits.lines():  # what the routes pack for, and what an override changed
        print(f"selfroute: {line}", flush=True)
    from gateway.commands._http_deadline import HeaderDeadlineProtocol

    values.update(header_timeout=args.header_timeout, body_timeout=args.body_timeout)
    _set_deadlines(values)
    # uvicorn's own access log stays off: ours (gateway.server.access_log) knows the key, route, tokens and cost.
    # With JSON lines uvicorn leaves logging alone (log_config None), so its lines go through our JSON handler.
    common = {
        "host": args.host,
        "port": args.port,
        "log_level": str(args.log_level).lower(),
        "access_log": False,
        "timeout_graceful_shutdown": args.shutdown_timeout,
        "timeout_keep_alive": args.keep_alive_timeout,
        "http": HeaderDeadlineProtocol,
    }
    if args.log_format == "json":
        common["log_config"] = None
    if args.workers == 1:
        uvicorn.run(app, **common)
        return 0
    # the app built above has migrated the ledger's schema, once, so workers do not race to at start-up;
    # each worker then has its own writer on the shared SQLite file (WAL)
    os.environ[WORKER_SETTINGS_ENV] = json.dumps(values)
    # set before the workers start (they import prometheus_client fresh): one /metrics over all of them
    from gateway.server.metrics import MULTIPROC_ENV

    os.environ.setdefault(MULTIPROC_ENV, str(_fresh_multiprocess_dir(settings.data_dir)))
    uvicorn.run("gateway.commands.serve:worker_app", factory=True, workers=args.workers, **common)
    return 0
