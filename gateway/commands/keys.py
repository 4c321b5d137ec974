"""`selfroute keys create|list|revoke`: named API keys in the ledger database (the data directory's SQLite file,
or the --ledger-url / $SELFROUTE_LEDGER_URL PostgreSQL that replicas share)."""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

HEADER = ("name", "prefix", "models", "collections", "budget", "spent", "rpm", "tpm", "expires", "status")


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "keys", parents=parents, help="create, list and revoke named API keys",
        description="Named API keys with per-key model allow-lists, collection grants, budgets and rate limits. "
                    "Keys are stored as salted HMAC-SHA256 hashes: `create` prints the key once, on its last line.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    from gateway.commands._common import add_ledger_argument

    create = actions.add_parser("create", parents=parents, help="create a key and print it once")
    add_ledger_argument(create)
    create.add_argument("name", help="1-64 letters, digits, '.', '_' or '-'; recorded in the ledger as the key")
    create.add_argument("--models", nargs="+", metavar="PATTERN",
                        help="model names or fnmatch patterns the key may use (aliases count); default: any")
    create.add_argument("--collections", nargs="+", metavar="NAME", help="collections granted to the key")
    create.add_argument("--budget-usd", type=float, help="stop the key once the ledger records this much spend")
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute (prompt and completion, as recorded)")
    create.add_argument("--expires", help="an age from now: 30m, 12h, 30d, 8w")
    create.set_defaults(func=run_create)
    listing = actions.add_parser("list", parents=parents, help="every key with its limits and spend so far")
    listing.add_argument("--json", action="store_true")
    add_ledger_argument(listing)
    listing.set_defaults(func=run_list)
    revoke = actions.add_parser("revoke", parents=parents, help="revoke a key (its name is never reused)")
    revoke.add_argument("name")
    add_ledger_argument(revoke)
    revoke.set_defaults(func=run_revoke)


def _store(args: argparse.Namespace):
    from gateway.commands._common import ledger_location
    from gateway.ledger.keys import KeyStore

    return KeyStore(ledger_location(args))


def _fail(args: argparse.Namespace, error) -> int:
    from gateway.ledger.errors import NotFound

    print(f"selfroute keys {args.action}: {getattr(error, 'message', error)}", file=sys.stderr)
    return 1 if isinstance(error, NotFound) else 2


def _failures() -> tuple[type[BaseException], ...]:
    """What a keys command reports as a message: the ledger's errors, and the drivers' for a database it cannot
    open at all (a malformed URL; its password is already taken out of the message)."""
    from gateway.ledger.dialect import database_error_types
    from gateway.ledger.errors import LedgerError

    return (LedgerError, *database_error_types()[0])


def run_create(args: argparse.Namespace) -> int:
    from gateway.ledger.keys import expiry_time

    store = _store(args)
    try:
        expires_at = expiry_time(args.expires) if args.expires else None
        key, secret = store.create(args.name, models=args.models, collections=args.collections,
                                   budget_usd=args.budget_usd, rpm=args.rpm, tpm=args.tpm, expires_at=expires_at)
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    print(f"created key {key.name!r} ({key.prefix}...); it is shown only now:")
    print(secret)
    return 0


def _when(value: float | None) -> str:
    return "-" if value is None else datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M")


def run_list(args: argparse.Namespace) -> int:
    from gateway.commands._common import print_table

    store = _store(args)
    try:
        keys, spend = store.list(), store.spend()
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    items = [k.to_dict(spend_usd=spend.get(k.name, 0.0)) for k in keys]
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    rows = []
    for k in items:
        status = "revoked" if k["revoked_at"] else "active" if k["active"] else "expired"
        rows.append([k["name"], k["prefix"] + "...", ",".join(k["models"]) if k["models"] is not None else "any",
                     ",".join(k["collections"]) or "-",
                     "-" if k["budget_usd"] is None else f"${k['budget_usd']:,.2f}", f"${k['spend_usd']:,.4f}",
                     str(k["rpm"] or "-"), str(k["tpm"] or "-"), _when(k["expires_at"]), status])
    print_table(rows, HEADER, sys.stdout, right={4, 5, 6, 7})
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        key = store.revoke(args.name)
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    print(f"revoked key {key.name!r} ({key.prefix}...)")
    return 0
