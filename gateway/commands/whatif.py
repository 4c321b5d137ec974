"""`selfroute whatif --policy CANDIDATE.yaml --since 7d [--json]`: every recorded routed request's decision
recomputed from its stored features under a candidate policy (gateway.evaluation.recorded, with the live decision
functions), against what the policy in force did: route mix, estimated cost, and quality where labels exist."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gateway.commands._common import add_ledger_argument, ledger_location


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "whatif", parents=parents, help="recorded traffic under a candidate policy", description=__doc__
    )
    parser.add_argument("--policy", required=True, type=Path, help="the candidate policy")
    parser.add_argument("--since", default="7d", help="an age: 30m, 12h, 7d, 4w (default 7d)")
    parser.add_argument("--json", action="store_true")
    add_ledger_argument(parser)
    parser.set_defaults(func=run)


def since_time(age: str) -> float:
    from gateway.ledger.keys import expiry_time

    return 2 * time.time() - expiry_time(age)  # expiry_time is now + age: mirror it into the past


def load_models(policy, policy_file):
    from gateway.routing.model_files import load_route_model, load_verifier_model

    return load_route_model(policy, policy_file), load_verifier_model(policy, policy_file)


def run(args: argparse.Namespace) -> int:
    from classifier.model import ModelFileError
    from gateway.evaluation.recorded import recorded_summary, replay, summary
    from gateway.ledger.dialect import database_error_types
    from gateway.ledger.errors import LedgerError
    from gateway.ledger.labels import recorded_requests
    from policies.loader import PolicyError, load_policy

    # a tuple mypy can check (it does not read a starred name in an except clause)
    errors: tuple[type[BaseException], ...] = (
        PolicyError,
        ModelFileError,
        OSError,
        ValueError,
        LedgerError,
        *database_error_types()[0],
    )
    try:
        policy, policy_file = load_policy(args.policy)
        model, verifier = load_models(policy, policy_file)
        requests = recorded_requests(ledger_location(args), since=since_time(args.since))
    except errors as exc:
        print(f"selfroute whatif: {exc}", file=sys.stderr)
        return 2
    now, candidate = recorded_summary(requests), summary(replay(requests, policy, model, verifier))
    if args.json:
        print(
            json.dumps(
                {"since": args.since, "policy": str(args.policy), "in_force": now, "candidate": candidate},
                indent=2,
                default=float,
            )
        )
        return 0
    if not requests:
        print(f"no routed requests with recorded features since {args.since}")
        return 0
    print(f"{len(requests)} routed requests since {args.since}; candidate {args.policy}")
    for name, s in (("in force", now), ("candidate", candidate)):
        quality = (
            f"{s['quality']:.1f} as good as long on {s['labelled']} labelled"
            if s["quality"] is not None
            else "no labels"
        )
        share = f"{s['cost_share']:.0%} of always-long" if s["cost_share"] is not None else "always-long unpriced"
        routes = ", ".join(f"{route} {n}" for route, n in s["routes"].items())
        print(f"  {name:<10} ${s['cost_usd']:.4f} ({share}); long {s['long_share']:.0%}; {quality}; {routes}")
    if candidate["unseen_cheap"]:
        print(
            f"  note: {candidate['unseen_cheap']} requests the candidate sends cheap went long when recorded: their "
            "cheap answers were never seen (costed at the median cheap leg, counted as accepted)"
        )
    return 0
