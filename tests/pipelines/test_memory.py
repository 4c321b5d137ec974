"""malloc_trim after large ingestions: it gives glibc's freed heap memory back to the kernel (measured here on this
process's own RSS), and the store calls it after an ingestion that embedded enough chunks, not after a small one."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from pipelines import memory
from pipelines.embedding import Embedder
from pipelines.memory import release_freed_memory
from pipelines.store import DocumentStore
from tests.support.pipelines import STORE_SETTINGS, distractor_documents, manual_document

glibc = pytest.mark.skipif(memory._malloc_trim() is None, reason="malloc_trim is glibc's")


def _rss_mb() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


@glibc
def test_release_returns_freed_heap_memory_to_the_kernel():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(40_000)]  # 160 MB of medium blocks on the heap, below mmap's threshold
    for block in blocks:
        ctypes.memset(block, 1, 4096)  # touched: resident
    pinned = libc.malloc(4096)  # keeps the heap's top in use, so free() alone cannot shrink it
    for block in blocks:
        libc.free(block)
    kept = _rss_mb()
    assert release_freed_memory() is True
    released = _rss_mb()
    libc.free(pinned)
    assert kept - released > 100, (kept, released)


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@glibc
def test_an_ingestion_of_enough_chunks_is_followed_by_a_trim(tmp_path, embedder, monkeypatch):
    calls = []

    def counted() -> bool:
        calls.append(1)
        return release_freed_memory()

    monkeypatch.setattr("pipelines.store.document_store.release_freed_memory", counted)
    store = DocumentStore(str(tmp_path / "db"), embedder, STORE_SETTINGS)
    monkeypatch.setattr("pipelines.store.document_store.TRIM_AFTER_CHUNKS", 10**9)
    small = store.ingest("small", [manual_document()])
    monkeypatch.setattr("pipelines.store.document_store.TRIM_AFTER_CHUNKS", small.chunks_written + 1)
    store.ingest("small-again", [manual_document()])
    assert calls == []  # fewer chunks than the threshold: no trim
    large = store.ingest("large", [manual_document(), *distractor_documents()])
    assert large.chunks_written > small.chunks_written and calls == [1]
    store.ingest("large", [manual_document(), *distractor_documents()])  # unchanged: nothing embedded, no trim
    assert calls == [1]
