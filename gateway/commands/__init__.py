"""One module per `selfroute` subcommand.

Each module defines `register(subparsers, parents)`: it adds its parser with `parents=parents`
(which carries --data-dir and --log-level) and sets `func=run` where `run(args) -> int`.
Modules import heavy libraries inside `run`, so `selfroute --help` stays fast.
"""
