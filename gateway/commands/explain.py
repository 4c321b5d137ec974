"""`selfroute explain QUESTION --collection NAME | --file F...`: the routing decision that POST /v1/route/explain
would return, computed in this process (no gateway running, no model called)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.commands._common import add_store_arguments, open_store, print_table


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "explain",
        parents=parents,
        help="the routing decision for a question about a collection or files",
        description="Route a question as the gateway would and print the decision, its features and each route's "
        "estimated tokens and cost. No model is called; attached files are embedded like inline "
        "documents (and cached in the store).",
        epilog="examples:\n"
        '  selfroute explain "Which court decides disputes under the berth lease?" --collection harbour\n'
        '  selfroute explain "What is the notice period?" --file contract.pdf --json\n'
        '  selfroute explain "Summarise section 4" -c harbour --policy policies/hosted-example.yaml',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("question", help="the question, as the last user message")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", "--collection", help="an ingested collection (see `selfroute collections list`)")
    source.add_argument(
        "-f",
        "--file",
        dest="files",
        type=Path,
        action="append",
        help="a document attached to the request (.txt, .md, .pdf, .html, a folder); repeatable",
    )
    add_store_arguments(parser)
    parser.add_argument("--max-tokens", type=int, default=None, help="the answer budget used in the cost estimates")
    parser.add_argument("--json", action="store_true", help="the explain endpoint's JSON")
    parser.set_defaults(func=run)


def _body(args: argparse.Namespace, alias: str) -> dict:
    from pipelines.ingest import load_documents

    options: dict = {}
    if args.collection:
        options["collection"] = args.collection
    else:
        options["documents"] = [{"id": d.id, "text": d.text, "title": d.title} for d in load_documents(args.files)]
        if not options["documents"]:
            raise ValueError("no readable document in " + ", ".join(str(f) for f in args.files))
    body = {"model": alias, "messages": [{"role": "user", "content": args.question}], "selfroute": options}
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    return body


def explain(args: argparse.Namespace) -> dict:
    """The explain endpoint's answer for this question (gateway.routing.explain.explain_plan)."""
    from gateway.ledger.pricing import PriceBook
    from gateway.protocol import parse_chat_request
    from gateway.routing.decision import Router
    from gateway.routing.explain import explain_plan
    from gateway.routing.model_files import load_route_model
    from gateway.routing.planner import RoutePlanner
    from policies.limits import effective_policy
    from policies.loader import load_policy

    policy, policy_path = load_policy(args.policy)
    policy, _ = effective_policy(policy)  # the windows the gateway would pack for
    chat, body = parse_chat_request(json.dumps(_body(args, policy.aliases[0])).encode())
    planner = RoutePlanner(policy, open_store(args, policy), Router(policy, load_route_model(policy, policy_path)))
    return explain_plan(policy, PriceBook(), planner, chat, body["messages"], None)


def _print(result: dict) -> None:
    probability = result["probability"]
    print(f"route: {result['route']}   reason: {result['reason']}")
    if probability is not None:
        print(f"P(cheap suffices): {probability:.3f}   threshold: {result['threshold']}")
    print(f"context: {result['source']}, {result['context_tokens']} tokens   question: {result['question']!r}")
    rows = [
        [
            route,
            e["model"],
            str(e["prompt_tokens"]),
            str(e["completion_tokens_estimate"]),
            f"${e['cost_usd']:.6f}",
            e.get("cache", "-").replace("_", " "),
        ]
        for route, e in result["estimates"].items()
    ]
    print_table(
        rows,
        ("route", "model", "prompt tokens", "answer tokens (est.)", "cost (est.)", "prompt cache"),
        sys.stdout,
        right={2, 3, 4},
    )
    features = result["features"]
    shown = (
        "context_tokens",
        "n_documents",
        "n_sections",
        "cross_ref_count",
        "top_score",
        "top_margin",
        "n_distinct_docs",
        "term_coverage",
    )
    print("features: " + ", ".join(f"{k}={_number(features[k])}" for k in shown if k in features))


def _number(value) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace) -> int:
    from classifier.model import ModelFileError
    from gateway.errors import GatewayError
    from gateway.routing.errors import RoutingError
    from pipelines.errors import CollectionNotFound
    from policies.loader import PolicyError

    try:
        result = explain(args)
    except GatewayError as exc:  # the same refusals the endpoint answers with 4xx (unknown collection: 404)
        print(f"selfroute explain: {exc.message}", file=sys.stderr)
        return 1 if exc.status == 404 else 2
    except (
        RoutingError
    ) as exc:  # the endpoint's 400 and 413 (an unknown model's 404 does not arise: no model is called)
        print(f"selfroute explain: {exc.message}", file=sys.stderr)
        return 2
    except CollectionNotFound as exc:  # the endpoint's 404
        print(f"selfroute explain: collection {exc.collection!r} does not exist or is empty", file=sys.stderr)
        return 1
    except (PolicyError, ModelFileError, ValueError, FileNotFoundError) as exc:
        print(f"selfroute explain: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        _print(result)
    return 0
