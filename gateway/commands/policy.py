"""`selfroute policy check FILE`: validate a policy and every file it names (the classifier is loaded), and
print it with every default filled in and its effective limits (each model's window, output limit, prices, and
what each route packs). Exit status 2 when the gateway could not start with it."""

from __future__ import annotations

import argparse
import json
import sys

EXAMPLES = """examples:
  selfroute policy check                                  # the shipped default
  selfroute policy check policies/hosted-example.yaml
  selfroute policy check --long-model openai/gpt-4.1      # what serve --long-model would run
  selfroute policy check my-policy.yaml --json            # the effective policy and limits as JSON"""


def register(subparsers, parents) -> None:
    from gateway.commands.serve import add_model_override_arguments

    parser = subparsers.add_parser("policy", parents=parents, help="work with routing policies")
    actions = parser.add_subparsers(dest="policy_command", metavar="ACTION")
    actions.required = True
    check = actions.add_parser(
        "check",
        parents=parents,
        help="validate a policy and print the effective policy",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("file", nargs="?", default=None, help="policy YAML (default: the shipped default)")
    add_model_override_arguments(check)
    check.add_argument("--json", action="store_true", help="print {policy, limits} as JSON")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    import yaml

    from gateway.commands.serve import override_problem
    from gateway.routing.model_files import check_policy_files
    from policies.limits import effective_policy
    from policies.loader import PolicyError, load_policy

    problem = override_problem(args)
    if problem:
        print(f"selfroute policy check: {problem}", file=sys.stderr)
        return 2
    try:
        policy, path = load_policy(args.file)
        policy, limits = effective_policy(
            policy,
            cheap_model=args.cheap_model,
            long_model=args.long_model,
            cheap_window=args.cheap_window,
            long_window=args.long_window,
        )
    except PolicyError as exc:
        print(f"invalid policy: {exc}", file=sys.stderr)
        return 2
    problems = check_policy_files(policy, path)
    for problem in problems:
        print(f"invalid policy: {path}: {problem}", file=sys.stderr)
    if problems:
        return 2
    if args.json:
        print(
            json.dumps(
                {"file": str(path), "policy": policy.model_dump(mode="json"), "limits": limits.to_dict()}, indent=2
            )
        )
        return 0
    print(f"# {path}: valid")
    print("# effective limits:")
    for line in limits.lines():
        print(f"#   {line}")
    print(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False, allow_unicode=True), end="")
    return 0
