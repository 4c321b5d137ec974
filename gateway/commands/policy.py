"""`selfroute policy check FILE`: validate a policy and every file it names (the classifier is loaded), and
print it with every default filled in. Exit status 2 when the gateway could not start with it."""
from __future__ import annotations

import argparse
import sys


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser("policy", parents=parents, help="work with routing policies")
    actions = parser.add_subparsers(dest="policy_command", metavar="ACTION")
    actions.required = True
    check = actions.add_parser("check", parents=parents, help="validate a policy and print the effective policy")
    check.add_argument("file", nargs="?", default=None, help="policy YAML (default: the shipped default)")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    import yaml

    from gateway.routing.model_files import check_policy_files
    from policies.loader import PolicyError, load_policy

    try:
        policy, path = load_policy(args.file)
    except PolicyError as exc:
        print(f"invalid policy: {exc}", file=sys.stderr)
        return 2
    problems = check_policy_files(policy, path)
    for problem in problems:
        print(f"invalid policy: {path}: {problem}", file=sys.stderr)
    if problems:
        return 2
    print(f"# {path}: valid")
    print(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False, allow_unicode=True), end="")
    return 0
