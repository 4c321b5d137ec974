"""Bulk ingestion on a Ray cluster (`selfroute ingest --ray ADDRESS`): documents are chunked and embedded by
worker actors spread over the cluster, each holding its own copy of the embedding model, and written by the
driver's DocumentStore.

Only the slow part moves. The driver still reads the files, applies the injection screen, skips unchanged
documents by content hash and does every write (the store's upserts keyed by document id and chunk position).
Each worker runs the store's own prepare_document and the same embedding model, so a collection ingested on
Ray holds the same ids, rows and (to float rounding) vectors as one ingested in a single process, and
re-ingesting upserts instead of duplicating. The files need only be on the driver's machine; every node
needs selfroute installed (`pip install 'selfroute[ray]'`) in the same Python version as the driver.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from pipelines.chunking import Chunk
from pipelines.documents import Document
from pipelines.embedding import EmbedderOptions
from pipelines.settings import ChunkingSettings
from pipelines.store.document_store import prepare_document

log = logging.getLogger(__name__)

LOCAL = "local"  # --ray local: start a one-machine cluster inside this process
# documents are sent to workers in groups of about this many characters (~250 chunks of 200 tokens): large
# enough that a task's overhead is small beside its embedding, small enough that workers share a corpus evenly
GROUP_CHARS = 200_000
GROUP_DOCUMENTS = 64
IN_FLIGHT_PER_WORKER = 2  # a worker's next group is already waiting when it finishes one

Item = tuple[Document, str, bool]  # (document, content hash, replaces an older version)
Prepared = tuple[dict, list[Chunk], bool, np.ndarray]


class Preparer:
    """One worker actor: its own embedding model, the store's prepare_document."""

    def __init__(self, options: EmbedderOptions, chunking: ChunkingSettings):
        self.embedder = options.build()
        self.chunking = chunking

    def prepare(self, items: list[Item]) -> list[Prepared]:
        rows = [(prepare_document(doc, digest, self.chunking), replaces) for doc, digest, replaces in items]
        # one embed call per group, like the single-process path's batches across documents
        vectors = self.embedder.embed([c.text for (_, chunks), _ in rows for c in chunks])
        prepared, start = [], 0
        for (row, chunks), replaces in rows:
            prepared.append((row, chunks, replaces, vectors[start : start + len(chunks)]))
            start += len(chunks)
        return prepared


class RayIngestEngine:
    """A DocumentStore.ingest engine (pipelines.store.document_store.IngestEngine) on Ray.

    address: "local" starts a cluster in this process with `workers` CPUs (default: this machine's cores);
    anything else goes to ray.init(address=...): "auto" on a node of a running cluster, "HOST:6379" for its
    head, "ray://HOST:10001" through Ray Client. workers: how many actors (default: the cluster's CPUs divided
    by cpus_per_worker). Use it as a context manager: it connects on entry and disconnects on exit (and stops
    the cluster it started); an already connected Ray (ray.is_initialized()) is used and left as it was."""

    def __init__(self, address: str, workers: int | None = None, cpus_per_worker: int = 1):
        if workers is not None and workers < 1:
            raise ValueError("workers must be at least 1")
        self.address = address
        self.workers = workers
        self.cpus_per_worker = cpus_per_worker
        self._connected_here = False
        self._temp: str | None = None  # the temp directory of a cluster started here
        self._actors: tuple[tuple, list] | None = None  # ((chunking, embedder options), actor handles)

    def __enter__(self) -> RayIngestEngine:
        import ray

        if not ray.is_initialized():
            quiet: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
            if self.address == LOCAL:
                cpus = (self.workers or os.cpu_count() or 1) * self.cpus_per_worker
                # a short temp path: Ray's socket paths must fit in 107 characters
                self._temp = tempfile.mkdtemp(prefix="selfroute-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
                ray.init(num_cpus=cpus, include_dashboard=False, _temp_dir=self._temp, **quiet)
            else:
                ray.init(address=self.address, **quiet)
            self._connected_here = True
        return self

    def __exit__(self, *exc) -> None:
        self._stop_pool()
        if self._connected_here:
            import ray

            ray.shutdown()
            self._connected_here = False
        if self._temp is not None:  # the local cluster's sockets and logs: gone with it
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def worker_count(self) -> int:
        import ray

        if self.workers is not None:
            return self.workers
        return max(1, int(ray.cluster_resources().get("CPU", 1)) // self.cpus_per_worker)

    def prepare(
        self, changed: Iterable[Item], chunking: ChunkingSettings, embedder: EmbedderOptions
    ) -> Iterator[Prepared]:
        """Chunk and embed on the workers, yielding each document as its group comes back. At most
        IN_FLIGHT_PER_WORKER groups per worker are out at once, so a large corpus is never all in memory."""
        pool: list = []  # started at the first group: a run with nothing changed starts no worker
        load: dict[int, int] = {}  # groups out per worker
        out: dict[Any, int] = {}  # future -> worker
        try:
            for group in _groups(changed):
                if not pool:
                    pool = self._pool(chunking, embedder)
                    load = dict.fromkeys(range(len(pool)), 0)
                while len(out) >= IN_FLIGHT_PER_WORKER * len(pool):
                    yield from self._collect(out, load)
                worker = min(load, key=load.__getitem__)
                out[pool[worker].prepare.remote(group)] = worker
                load[worker] += 1
            while out:
                yield from self._collect(out, load)
        except BaseException:  # failed or abandoned (cancelled): groups still out would come back to no one
            self._stop_pool()
            raise

    def _pool(self, chunking: ChunkingSettings, embedder: EmbedderOptions) -> list:
        """The worker actors, started at the first ingestion and kept (models loaded) until the block ends."""
        import ray

        # each worker's model uses the CPUs Ray gave it, not every core of its machine
        options = replace(embedder, threads=self.cpus_per_worker)
        if self._actors is None or self._actors[0] != (chunking, options):
            self._stop_pool()
            actor = ray.remote(num_cpus=self.cpus_per_worker)(Preparer)
            self._actors = ((chunking, options), [actor.remote(options, chunking) for _ in range(self.worker_count())])
        return self._actors[1]

    def _stop_pool(self) -> None:
        if self._actors is not None:
            import ray

            for handle in self._actors[1]:
                ray.kill(handle)
            self._actors = None

    @staticmethod
    def _collect(out: dict, load: dict) -> Iterator[Prepared]:
        import ray

        done, _ = ray.wait(list(out), num_returns=1)
        for future in done:
            load[out.pop(future)] -= 1
            yield from ray.get(future)


def _groups(changed: Iterable[Item]) -> Iterator[list[Item]]:
    group: list[Item] = []
    size = 0
    for item in changed:
        group.append(item)
        size += len(item[0].text)
        if size >= GROUP_CHARS or len(group) >= GROUP_DOCUMENTS:
            yield group
            group, size = [], 0
    if group:
        yield group
