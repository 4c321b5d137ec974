"""`selfroute keys create|list|edit|rotate|revoke`: named API keys in the ledger database (the data directory's
SQLite file, or the --ledger-url / $SELFROUTE_LEDGER_URL PostgreSQL that replicas share).

The first key changes how the gateway works (open to anyone -> a key on every request), and revoking the last one
changes it back: both say so, loudly, on stderr."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime

HEADER = ("name", "prefix", "models", "collections", "budget", "period", "spent", "rpm", "tpm", "expires", "status")
EXAMPLES = """examples:
  selfroute keys create --admin                      # the admin key: dashboard and /v1/admin/*
  selfroute keys create team --models 'openai/*' selfroute --collections harbour --budget-usd 50 --budget-period 30d
  selfroute keys list --json
  selfroute keys edit team --rpm 60 --tpm 200000 --budget-usd none
  selfroute keys rotate team                         # a new secret; the old one stops working
  selfroute keys revoke team"""


def _optional(kind):
    """A limit's value, or `none` to clear it (edit)."""

    def parse(text: str):
        if text.strip().lower() in ("none", "off", "-"):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None

    return parse


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "keys",
        parents=parents,
        help="create, list, edit, rotate and revoke named API keys",
        description="Named API keys with per-key model allow-lists, collection grants, budgets (optionally per "
        "period) and rate limits, and the admin key. Keys are stored as salted HMAC-SHA256 hashes: "
        "`create` and `rotate` print the key once, on their last line.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    from gateway.commands._common import add_ledger_argument

    def action(name: str, help_text: str, func, examples: str):
        sub = actions.add_parser(
            name,
            parents=parents,
            help=help_text,
            description=help_text,
            epilog="examples:\n" + examples,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_ledger_argument(sub)
        sub.set_defaults(func=func)
        return sub

    create = action(
        "create",
        "create a key and print it once",
        run_create,
        "  selfroute keys create team --budget-usd 20 --budget-period 30d --rpm 60\n"
        "  selfroute keys create --admin\n"
        "  selfroute keys create reader --models selfroute --collections harbour --expires 90d",
    )
    create.add_argument(
        "name",
        nargs="?",
        default=None,
        help="1-64 letters, digits, '.', '_' or '-'; recorded in the ledger as the key (with --admin: default 'admin')",
    )
    create.add_argument(
        "--admin",
        action="store_true",
        help="the admin key: the dashboard, /v1/admin/* and every collection, no limits (kept hashed "
        "like every key; $SELFROUTE_ADMIN_KEY keeps working beside it)",
    )
    create.add_argument(
        "--models",
        nargs="+",
        metavar="PATTERN",
        help="model names or fnmatch patterns the key may use (aliases count); default: any",
    )
    create.add_argument("--collections", nargs="+", metavar="NAME", help="collections granted to the key")
    create.add_argument("--budget-usd", type=float, help="stop the key once the ledger records this much spend")
    create.add_argument(
        "--budget-period",
        help="the budget holds per period, counted from now: 1h, 24h, 7d, 30d, 4w (default: for the key's whole life)",
    )
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute (prompt and completion, as recorded)")
    create.add_argument("--expires", help="an age from now: 30m, 12h, 30d, 8w")

    listing = action(
        "list",
        "every key with its limits and spend so far (in the current budget period)",
        run_list,
        "  selfroute keys list\n  selfroute keys list --json",
    )
    listing.add_argument("--json", action="store_true", help="a JSON list, one object a key")

    edit = action(
        "edit",
        "change a key's model list, grants and limits (what is not given stays)",
        run_edit,
        "  selfroute keys edit team --collections harbour manuals\n"
        "  selfroute keys edit team --budget-usd 100 --budget-period 30d\n"
        "  selfroute keys edit team --rpm none --models any",
    )
    edit.add_argument("name")
    edit.add_argument("--models", nargs="+", metavar="PATTERN", help="replace the model list; 'any' for any model")
    edit.add_argument("--collections", nargs="*", metavar="NAME", help="replace the grants (none given: no grants)")
    edit.add_argument("--budget-usd", type=_optional(float), default=argparse.SUPPRESS, help="a new budget, or 'none'")
    edit.add_argument(
        "--budget-period",
        help="a budget period (1h, 24h, 7d, 30d, 4w; a new period starts now), or 'none' for the key's whole life",
    )
    edit.add_argument("--rpm", type=_optional(int), default=argparse.SUPPRESS, help="requests per minute, or 'none'")
    edit.add_argument("--tpm", type=_optional(int), default=argparse.SUPPRESS, help="tokens per minute, or 'none'")
    edit.add_argument("--expires", help="an age from now (30d), or 'never'")

    rotate = action(
        "rotate",
        "give a key a new secret (printed once); the old one stops working",
        run_rotate,
        "  selfroute keys rotate team",
    )
    rotate.add_argument("name")

    revoke = action("revoke", "revoke a key (its name is never reused)", run_revoke, "  selfroute keys revoke team")
    revoke.add_argument("name")


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


def _configured_elsewhere() -> list[str]:
    """Keys this shell's environment gives a gateway started from it (the gateway's own environment may differ)."""
    from gateway.server.auth import ADMIN_KEY_ENV, KEYS_ENV

    return [name for name in (KEYS_ENV, ADMIN_KEY_ENV) if os.environ.get(name)]


def _banner(lines: list[str]) -> None:
    rule = "=" * 78
    print("\n".join([rule, *lines, rule]), file=sys.stderr)


def first_key_notice(key, collections_hint: bool) -> list[str]:
    """What creating the first key changes, and how to go on."""
    lines = [
        f"NOTICE: {key.name!r} is the gateway's first key. A gateway with no key was open to anyone who can",
        "reach it; within 2 seconds every request to it needs a key (unless it was started with",
        "SELFROUTE_API_KEYS, --keys-file or SELFROUTE_ADMIN_KEY, and so was never open):",
        '  - clients must send a key: one that sends none (the quick start\'s api_key="none") gets 401;',
    ]
    if key.admin:
        lines += [
            "  - this admin key opens the dashboard and /v1/admin/*; give clients their own keys:",
            "      selfroute keys create NAME",
        ]
    else:
        lines += [
            "  - the dashboard and /v1/admin/* need the admin key:",
            "      selfroute keys create --admin        (or set SELFROUTE_ADMIN_KEY where the gateway runs)",
        ]
        if collections_hint:
            lines += [
                "  - collections ingested with `selfroute ingest` belong to no key: this key sees one only by",
                f"    grant:  selfroute keys edit {key.name} --collections NAME...",
            ]
    lines += [f"  - to open the gateway again: selfroute keys revoke {key.name}"]
    return lines


def run_create(args: argparse.Namespace) -> int:
    from gateway.ledger.keys import ADMIN_NAME, expiry_time, period_seconds

    name = args.name or (ADMIN_NAME if args.admin else None)
    if name is None:
        print("selfroute keys create: give the key a NAME (or --admin for the admin key)", file=sys.stderr)
        return 2
    store = _store(args)
    try:
        expires_at = expiry_time(args.expires) if args.expires else None
        period = period_seconds(args.budget_period) if args.budget_period else None
        first = not store.any_keys()
        key, secret = store.create(
            name,
            models=args.models,
            collections=args.collections,
            budget_usd=args.budget_usd,
            rpm=args.rpm,
            tpm=args.tpm,
            expires_at=expires_at,
            admin=args.admin,
            budget_period_s=period,
        )
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    if first:
        _banner(first_key_notice(key, collections_hint=args.collections is None))
    kind = "admin key" if key.admin else "key"
    print(f"created {kind} {key.name!r} ({key.prefix}...); it is shown only now:")
    print(secret)
    return 0


def _when(value: float | None) -> str:
    return "-" if value is None else datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M")


def run_list(args: argparse.Namespace) -> int:
    from gateway.commands._common import print_table

    store = _store(args)
    try:
        items = store.listing()
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    rows = []
    for k in items:
        status = "revoked" if k["revoked_at"] else "active" if k["active"] else "expired"
        models = "any" if k["models"] is None else ",".join(k["models"])
        period = f"{k['budget_period']} from {_when(k['period_start'])}" if k["budget_period"] else "-"
        rows.append(
            [
                k["name"],
                k["prefix"] + "...",
                "admin" if k["admin"] else models,
                ",".join(k["collections"]) or ("all" if k["admin"] else "-"),
                "-" if k["budget_usd"] is None else f"${k['budget_usd']:,.2f}",
                period,
                f"${k['spend_usd']:,.4f}",
                str(k["rpm"] or "-"),
                str(k["tpm"] or "-"),
                _when(k["expires_at"]),
                status,
            ]
        )
    print_table(rows, HEADER, sys.stdout, right={4, 6, 7, 8})
    return 0


def run_edit(args: argparse.Namespace) -> int:
    from gateway.ledger.keys import KEEP, expiry_time, period_seconds

    changes: dict = {}
    if args.models is not None:
        changes["models"] = None if [m.lower() for m in args.models] == ["any"] else args.models
    if args.collections is not None:
        changes["collections"] = args.collections
    for field in ("budget_usd", "rpm", "tpm"):  # absent unless given (SUPPRESS): 'none' clears the limit
        if hasattr(args, field):
            changes[field] = getattr(args, field)
    store = _store(args)
    try:
        if args.budget_period is not None:
            none = args.budget_period.strip().lower() in ("none", "off", "-")
            changes["budget_period_s"] = None if none else period_seconds(args.budget_period)
        if args.expires is not None:
            changes["expires_at"] = None if args.expires.strip().lower() == "never" else expiry_time(args.expires)
        if not changes:
            print(
                "selfroute keys edit: nothing to change (give --models, --collections, --budget-usd, "
                "--budget-period, --rpm, --tpm or --expires)",
                file=sys.stderr,
            )
            return 2
        key = store.edit(args.name, **{k: changes.get(k, KEEP) for k in changes})
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    item = key.to_dict()
    shown = {k: item[k] for k in ("models", "collections", "budget_usd", "budget_period", "rpm", "tpm")}
    shown["expires"] = _when(item["expires_at"])
    print(
        f"edited key {key.name!r} (running gateways apply it within 2 seconds): "
        + ", ".join(f"{k}={v}" for k, v in shown.items())
    )
    return 0


def run_rotate(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        key, secret = store.rotate(args.name)
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    print(
        f"rotated key {key.name!r}: the old secret stops working (within 2 seconds on running gateways); "
        f"the new one ({key.prefix}...) is shown only now:"
    )
    print(secret)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        key = store.revoke(args.name)
        last = not store.any_keys()
    except _failures() as error:
        return _fail(args, error)
    finally:
        store.close()
    print(f"revoked key {key.name!r} ({key.prefix}...)")
    if last:
        elsewhere = _configured_elsewhere()
        lines = [
            f"NOTICE: {key.name!r} was the last key in the key store: the gateway returns to its configured mode",
            "within 2 seconds. Started without SELFROUTE_API_KEYS, --keys-file or SELFROUTE_ADMIN_KEY, it is",
            "OPEN again to anyone who can reach it; keep it keyed with: selfroute keys create NAME",
        ]
        if elsewhere:
            lines.append(f"(this shell sets {', '.join(elsewhere)}: a gateway started from it stays keyed)")
        _banner(lines)
    return 0
