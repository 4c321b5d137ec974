"""`selfroute ingest COLLECTION PATH...`: add files and folders to a document collection."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "ingest", parents=parents,
        help="ingest .txt/.md/.pdf/.html files or folders into a collection (unchanged files are skipped)",
    )
    parser.add_argument("collection", help="collection name (letters, digits, '-', '_', '.')")
    parser.add_argument("paths", nargs="+", type=Path, help="files or folders (recursively)")
    parser.add_argument("--store-uri", default=None,
                        help="LanceDB URI for collections, e.g. s3://bucket/selfroute (default: $SELFROUTE_STORE_URI, "
                             "else DATA_DIR/lancedb)")
    parser.add_argument("--policy", type=Path, default=None, help="policy whose rag settings (chunking, embedding model) apply")
    parser.add_argument("--json", action="store_true", help="print the ingest report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gateway.settings import Settings, resolve_data_dir
    from pipelines.embedding import Embedder
    from pipelines.ingest import ingest_paths
    from pipelines.store import DocumentStore, validate_collection_name
    from policies.loader import PolicyError, load_policy

    try:
        policy, _ = load_policy(args.policy)
        validate_collection_name(args.collection)
    except (PolicyError, ValueError) as exc:
        print(f"selfroute ingest: {exc}")
        return 2
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(f"selfroute ingest: no such file or folder: {', '.join(missing)}")
        return 2
    settings = Settings(data_dir=resolve_data_dir(args.data_dir))
    if args.store_uri:
        settings.vector_store_uri = args.store_uri
    rag = policy.rag
    store = DocumentStore(settings.store_uri, Embedder(rag.embedding_model, batch_size=rag.embedding_batch_size), rag)
    report = ingest_paths(store, args.collection, args.paths, show_progress=not args.no_progress)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(
            f"{args.collection}: {len(report.added)} added, {len(report.updated)} updated, "
            f"{len(report.unchanged)} unchanged, {report.chunks_written} chunks written in {report.seconds:.1f}s"
        )
    return 0
