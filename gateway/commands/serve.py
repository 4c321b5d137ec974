"""`selfroute serve`: run the gateway under uvicorn."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers, parents) -> None:
    from gateway.commands._common import add_ledger_argument

    parser = subparsers.add_parser("serve", parents=parents, help="run the OpenAI-compatible gateway")
    parser.add_argument("--store-uri", default=None,
                        help="LanceDB URI for collections, e.g. s3://bucket/selfroute (default: $SELFROUTE_STORE_URI, "
                             "else DATA_DIR/lancedb)")
    add_ledger_argument(parser)
    parser.add_argument("--policy", type=Path, default=None, help="routing policy YAML (default: the shipped default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--cheap-model", default=None, help="override the policy's cheap model (litellm model string)")
    parser.add_argument("--long-model", default=None, help="override the policy's long model (litellm model string)")
    parser.add_argument("--keys-file", type=Path, default=None, help="API keys, one a line (also $SELFROUTE_API_KEYS)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.routing.model_files import check_policy_files
    from gateway.server.app import create_app
    from gateway.settings import Settings, resolve_data_dir
    from policies.loader import PolicyError

    settings = Settings(
        data_dir=resolve_data_dir(args.data_dir),
        policy_path=args.policy,
        cheap_model=args.cheap_model,
        long_model=args.long_model,
        keys_file=args.keys_file,
    )
    if args.store_uri:
        settings.vector_store_uri = args.store_uri
    if args.ledger_url:
        settings.ledger_url = args.ledger_url
    try:
        app = create_app(settings)
    except PolicyError as exc:
        print(f"selfroute serve: invalid policy: {exc}", file=sys.stderr)
        return 2
    gateway = app.state.gateway
    # the files the policy names load at start-up, inside uvicorn: a missing one would end in a traceback there
    problems = check_policy_files(gateway.policy, gateway.policy_path)
    for problem in problems:
        print(f"selfroute serve: invalid policy: {gateway.policy_path or 'default'}: {problem}", file=sys.stderr)
    if problems:
        return 2
    print(f"selfroute: data in {settings.data_dir}; policy {app.state.gateway.policy.name!r}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=str(args.log_level).lower(), access_log=False)
    return 0
