"""`selfroute collections list|show|delete`: the document collections in the store, as the gateway sees them."""

from __future__ import annotations

import argparse
import json
import sys

from gateway.commands._common import add_store_arguments, open_store, print_table


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "collections",
        parents=parents,
        help="list, inspect or delete document collections",
        description="The collections in the store (the data directory's, or --store-uri's), as the gateway sees them.",
        epilog="examples:\n"
        "  selfroute collections list --json\n"
        "  selfroute collections show harbour\n"
        "  selfroute collections delete old-contracts",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="collections_command", metavar="ACTION")
    actions.required = True

    listing = actions.add_parser("list", parents=parents, help="collections with their document and chunk counts")
    show = actions.add_parser(
        "show", parents=parents, help="a collection's documents: tokens, sections, cross-references"
    )
    show.add_argument("name")
    delete = actions.add_parser("delete", parents=parents, help="delete a collection and its chunks")
    delete.add_argument("name")
    for action, func in ((listing, run_list), (show, run_show), (delete, run_delete)):
        add_store_arguments(action)
        action.add_argument("--json", action="store_true", help="print JSON")
        action.set_defaults(func=func)


def _store(args: argparse.Namespace):
    from policies.loader import load_policy

    policy, _ = load_policy(args.policy)
    return open_store(args, policy)


def _info(args: argparse.Namespace):
    """(store, CollectionInfo) or a message and exit status."""
    from policies.loader import PolicyError

    try:
        store = _store(args)
        info = store.collection(args.name)
    except (PolicyError, ValueError) as exc:
        print(f"selfroute collections {args.collections_command}: {exc}", file=sys.stderr)
        return None, 2
    if info is None:
        print(
            f"selfroute collections {args.collections_command}: collection {args.name!r} does not exist",
            file=sys.stderr,
        )
        return None, 1
    return store, info


def run_list(args: argparse.Namespace) -> int:
    from policies.loader import PolicyError

    try:
        infos = _store(args).collections(include_inline=False)
    except PolicyError as exc:
        print(f"selfroute collections list: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": i.name,
                        "document_count": len(i.documents),
                        "chunk_count": i.chunk_count,
                        "tokens": sum(d.tokens for d in i.documents),
                    }
                    for i in infos
                ],
                indent=2,
            )
        )
        return 0
    if not infos:
        print("no collections", file=sys.stderr)
        return 0
    rows = [[i.name, str(len(i.documents)), str(i.chunk_count), str(sum(d.tokens for d in i.documents))] for i in infos]
    print_table(rows, ("name", "documents", "chunks", "tokens"), sys.stdout, right={1, 2, 3})
    return 0


def run_show(args: argparse.Namespace) -> int:
    store, info = _info(args)
    if store is None:
        return info
    if args.json:
        print(json.dumps(info.to_dict(), indent=2, ensure_ascii=False))
        return 0
    print(f"{info.name}: {len(info.documents)} documents, {info.chunk_count} chunks")
    rows = [
        [d.id, d.title or "-", str(d.tokens), str(len(d.sections)), str(d.cross_refs), str(d.chunks)]
        for d in info.documents
    ]
    print_table(rows, ("id", "title", "tokens", "sections", "cross-refs", "chunks"), sys.stdout, right={2, 3, 4, 5})
    return 0


def run_delete(args: argparse.Namespace) -> int:
    store, info = _info(args)
    if store is None:
        return info
    store.delete_collection(args.name)
    summary = {
        "name": info.name,
        "deleted": True,
        "document_count": len(info.documents),
        "chunk_count": info.chunk_count,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"deleted {info.name}: {len(info.documents)} documents, {info.chunk_count} chunks")
    return 0
