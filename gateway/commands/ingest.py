"""`selfroute ingest COLLECTION PATH...`: add files and folders to a document collection."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.commands._common import add_store_arguments, open_store, whole_number

if TYPE_CHECKING:
    from pipelines.safety.injection import Mode


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "ingest",
        parents=parents,
        help="ingest .txt/.md/.pdf/.html files or folders into a collection (unchanged files are skipped)",
        description="Ingest files or folders into a collection: chunked, embedded and stored; unchanged files are "
        "skipped. The policy's security.injection applies to each file.",
        epilog="examples:\n"
        "  selfroute ingest --sample                       # the harbour sample, collection 'harbour'\n"
        "  selfroute ingest contracts ./contracts/ --no-progress\n"
        "  selfroute ingest manuals pumps.pdf valves.md --json\n"
        "  selfroute ingest docs ./docs --store-uri s3://bucket/selfroute\n"
        "  selfroute ingest docs ./docs --ray local --ray-workers 2     # chunk and embed in 2 Ray workers\n"
        "  selfroute ingest docs ./docs --ray auto                      # on a node of a running Ray cluster",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "collection",
        nargs="?",
        help="collection name (letters, digits, '-', '_', '.'); with --sample, default 'harbour'",
    )
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders (recursively)")
    parser.add_argument(
        "--sample",
        action="store_true",
        help="ingest the sample shipped with selfroute: three short documents of a fictional harbour "
        "(a berth lease, a pump-station manual, a safety code) that refer to each other",
    )
    add_store_arguments(parser)
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="chunk and embed on a Ray cluster (pip install 'selfroute[ray]'): 'local' starts one on this "
        "machine, 'auto' joins the cluster this node belongs to, HOST:6379 its head, ray://HOST:10001 through "
        "Ray Client. Files are read and the store written here; same ids, rows and upserts as without --ray",
    )
    parser.add_argument(
        "--ray-workers",
        type=whole_number("workers"),
        default=None,
        metavar="N",
        help="with --ray: how many workers (each one CPU and its own copy of the embedding model; default: the "
        "cluster's CPUs, or this machine's cores with --ray local)",
    )
    parser.add_argument("--json", action="store_true", help="print the ingest report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.ingest import ingest_paths
    from pipelines.samples import SAMPLE_COLLECTION, sample_path
    from pipelines.store import check_writable_name
    from policies.loader import PolicyError, load_policy

    if args.sample:
        args.collection = args.collection or SAMPLE_COLLECTION
        args.paths = [*args.paths, sample_path()]
    if not args.collection or not args.paths:
        print("selfroute ingest: give a COLLECTION and at least one PATH, or --sample", file=sys.stderr)
        return 2
    try:
        policy, _ = load_policy(args.policy)
        check_writable_name(args.collection)
    except (PolicyError, ValueError) as exc:
        print(f"selfroute ingest: {exc}", file=sys.stderr)
        return 2
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(f"selfroute ingest: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.ray_workers is not None and not args.ray:
        print("selfroute ingest: --ray-workers needs --ray", file=sys.stderr)
        return 2
    store = open_store(args, policy)
    flags: list[dict] = []
    screen = _screen(policy.security.injection, flags)
    with _engine(args) as engine:
        report = ingest_paths(
            store, args.collection, args.paths, show_progress=not args.no_progress, screen=screen, engine=engine
        )
    blocked = [f["document"] for f in flags if f["action"] == "blocked"]
    if args.json:
        print(json.dumps({**report.to_dict(), **({"flags": flags} if flags else {})}, indent=2))
    else:
        for found in flags:
            print(
                f"selfroute ingest: {found['document']}: instruction-like text (rules: {', '.join(found['rules'])})"
                f" {found['action']}{', not ingested' if found['action'] == 'blocked' else ''}",
                file=sys.stderr,
            )
        print(
            f"{args.collection}: {len(report.added)} added, {len(report.updated)} updated, "
            f"{len(report.unchanged)} unchanged, {report.chunks_written} chunks written in {report.seconds:.1f}s"
            + (f"; {len(blocked)} blocked" if blocked else "")
        )
    return 1 if blocked else 0


def _engine(args: argparse.Namespace):
    """The Ray engine for --ray (connected while the block runs), else no engine."""
    if not args.ray:
        return nullcontext()
    try:
        import ray  # noqa: F401  (the optional extra; imported again where the engine connects)
    except ImportError as exc:
        raise SystemExit(f"selfroute ingest: --ray needs Ray: pip install 'selfroute[ray]' ({exc})") from exc
    from pipelines.ray_ingest import RayIngestEngine

    return RayIngestEngine(args.ray, workers=args.ray_workers)


def _screen(mode: Mode, flags: list[dict]):
    """The policy's security.injection applied to each file as it is loaded, as for documents posted over HTTP:
    flag reports, strip removes the matched spans and reports, block leaves the file out and reports (the other
    files are ingested; the command then exits 1). Findings are appended to `flags`."""
    if mode == "off":
        return None
    from dataclasses import replace

    from pipelines.safety.injection import InjectionScanner

    scanner = InjectionScanner(mode)

    def screen(documents):
        for document in documents:
            result = scanner.apply(document.text)
            if result.findings:
                flags.append(result.report(document.id))
                if result.blocked:
                    continue
                if mode == "strip":
                    document = replace(document, text=result.kept_text)
            yield document

    return screen
