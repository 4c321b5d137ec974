"""What keeping the gateway's caches per key costs: a question another key already asked, or a document another key
already sent, is embedded or scanned again instead of read from the cache. Prints, for each cache, the time of a miss
(what a second key now pays) and of a hit (what it paid before), median and p90 over repeats.

Not collected by pytest.

    .venv/bin/python tests/benchmarks/bench_tenant_caches.py [--doc FILE] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.protocol import InlineDocument  # noqa: E402
from gateway.server.injection import screen_documents  # noqa: E402
from pipelines.embedding import Embedder  # noqa: E402
from pipelines.samples import sample_path  # noqa: E402
from pipelines.scope import KeyScope  # noqa: E402


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1000.0


def summary(name: str, values: list[float]) -> None:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    print(f"{name:<40} median {statistics.median(values):8.2f} ms   p90 {p90:8.2f} ms   n={len(values)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--doc", type=Path, help="a document to scan (default: the sample, repeated to ~480 kB)")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    embedder = Embedder()
    embedder.embed_query("warm-up")  # load the model copy first
    misses, hits = [], []
    for i in range(args.repeats):
        question = f"Which berth may the tanker number {i} use after the inspection?"

        def ask(key: str):
            return timed(lambda: embedder.embed_query(question, KeyScope(key)))

        misses.append(ask("first-key"))  # not seen before: embedded
        hits.append(ask("first-key"))  # the same key again: remembered
        ask("second-key")  # per-key caches: embedded again (this is the miss measured above)
    summary("question embedding, miss (another key)", misses)
    summary("question embedding, hit (same key)", hits)

    if args.doc:
        text = args.doc.read_text(errors="replace")
    else:
        sample = "\n\n".join(p.read_text() for p in sorted(sample_path().glob("*.md")))
        text = (sample + "\n\n") * (480_000 // len(sample) + 1)
    print(f"document: {len(text.encode()):,} bytes")
    scan_misses, scan_hits = [], []
    for i in range(max(3, args.repeats // 3)):
        body = text + f"\n\nrevision {i}\n"  # a new text each round: the first scan is a miss
        scan_misses.append(
            timed(lambda: screen_documents("flag", [InlineDocument(id="d", text=body)], "d", KeyScope("first")))
        )
        scan_hits.append(
            timed(lambda: screen_documents("flag", [InlineDocument(id="d", text=body)], "d", KeyScope("first")))
        )
    summary("injection scan, miss (another key)", scan_misses)
    summary("injection scan, hit (same key)", scan_hits)


if __name__ == "__main__":
    main()
