"""`selfroute whatif --policy CANDIDATE.yaml --since 7d [--json]`: every recorded routed request's decision
recomputed from its stored features under a candidate policy (gateway.evaluation.recorded, with the live decision
functions), against what the policy in force did: route mix, estimated cost, and quality where labels exist."""

from __future__ import annotations

import argparse
import json
import sys
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


def run(args: argparse.Namespace) -> int:
    from gateway.evaluation.recorded import RecordedReadError, read_recorded, recorded_summary, replay, summary

    try:
        found = read_recorded(args.policy, ledger_location(args), args.since)
    except RecordedReadError as exc:
        print(f"selfroute whatif: {exc}", file=sys.stderr)
        return 2
    requests = found.requests
    now = recorded_summary(requests)
    candidate = summary(replay(requests, found.policy, found.route_model, found.verifier))
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
