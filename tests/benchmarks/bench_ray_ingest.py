"""Bulk ingestion in one process vs on a local Ray cluster with 1 and 2 workers (not collected by pytest).

Each run ingests the same files into a fresh local LanceDB directory with `pipelines.ingest.ingest_paths`, the
code `selfroute ingest` runs (with --ray: the same call with a RayIngestEngine). For Ray, the cluster is started
in this process with as many CPUs as workers, and the workers are warmed first by ingesting one small file into
another collection (actors started, models loaded), so the timed figure is the ingestion itself; the start-up is
printed beside it. Every run must write the same number of chunks.

    HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python tests/benchmarks/bench_ray_ingest.py \\
        ../shared/data/corpus_structured_docs/common-licenses ../shared/data/corpus_structured_docs/gnu-standards
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.embedding import Embedder  # noqa: E402
from pipelines.ingest import ingest_paths  # noqa: E402
from pipelines.ray_ingest import RayIngestEngine  # noqa: E402
from pipelines.samples import sample_path  # noqa: E402
from pipelines.settings import RagSettings  # noqa: E402
from pipelines.store import DocumentStore  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="files or folders to ingest")
    parser.add_argument("--workers", default="1,2", help="Ray worker counts to measure (comma-separated)")
    args = parser.parse_args()
    warm = sample_path() / "berth-lease.md"
    print(f"cores {os.cpu_count()}, load before {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        embedder = Embedder()
        store = DocumentStore(str(Path(tmp) / "single"), embedder, RagSettings())
        ingest_paths(store, "warm", [warm], show_progress=False)  # the model loaded, as the workers' are
        started = time.perf_counter()
        report = ingest_paths(store, "bench", args.paths, show_progress=False)
        seconds = time.perf_counter() - started
        chunks = report.chunks_written
        print(f"single process: {chunks} chunks in {seconds:.1f} s = {chunks / seconds:.1f} chunks/s")
        for workers in [int(w) for w in args.workers.split(",")]:
            store = DocumentStore(str(Path(tmp) / f"ray{workers}"), embedder, RagSettings())
            began = time.perf_counter()
            with RayIngestEngine("local", workers=workers) as engine:
                ingest_paths(store, "warm", [warm], show_progress=False, engine=engine)
                start_up = time.perf_counter() - began
                started = time.perf_counter()
                report = ingest_paths(store, "bench", args.paths, show_progress=False, engine=engine)
                seconds = time.perf_counter() - started
            assert report.chunks_written == chunks, (report.chunks_written, chunks)
            print(
                f"ray, {workers} worker(s): {chunks} chunks in {seconds:.1f} s = {chunks / seconds:.1f} chunks/s "
                f"(cluster start and warm-up {start_up:.1f} s), load {os.getloadavg()[0]:.2f}"
            )


if __name__ == "__main__":
    main()
