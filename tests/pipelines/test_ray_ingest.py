"""Ingestion on a local Ray cluster (pipelines.ray_ingest) writes what the single-process path writes: the same
documents, chunk ids, texts and (to float rounding) vectors, and re-ingesting upserts without duplicates."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest

from pipelines.embedding import Embedder
from pipelines.ingest import ingest_paths
from pipelines.samples import sample_path
from pipelines.store import DocumentStore
from tests.support.pipelines import STORE_SETTINGS, distractor_documents, manual_document

ray = pytest.importorskip("ray")

from pipelines import ray_ingest  # noqa: E402
from pipelines.ray_ingest import RayIngestEngine  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    """A two-CPU Ray cluster on 127.0.0.1, started in this process for this module and stopped after it."""
    temp = tempfile.mkdtemp(prefix="sr-ray-", dir="/tmp")  # Ray's socket paths must stay short
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


def _corpus(folder):
    folder.mkdir()
    for doc in [manual_document(), *distractor_documents()]:
        (folder / doc.id).write_text(doc.text)
    for path in sorted(sample_path().glob("*.md")):
        (folder / path.name).write_text(path.read_text())
    (folder / "page.html").write_text("<html><body><h1>Fees</h1><p>The berth fee is 40 euros a day.</p></body></html>")
    return folder


def _contents(store: DocumentStore, collection: str):
    docs = store.db.open_table(collection + "__docs").to_arrow().sort_by("id").to_pylist()
    chunks = (
        store.db.open_table(collection + "__chunks")
        .to_arrow()
        .sort_by([("doc_id", "ascending"), ("position", "ascending")])
    )
    vectors = np.asarray(chunks["vector"].to_pylist(), dtype=np.float32)
    return docs, chunks.drop_columns(["vector"]).to_pylist(), vectors


def _assert_same(one: DocumentStore, other: DocumentStore, collection: str) -> int:
    docs, chunks, vectors = _contents(one, collection)
    ray_docs, ray_chunks, ray_vectors = _contents(other, collection)
    assert ray_docs == docs  # ids, texts, hashes, token and chunk counts, sections
    assert ray_chunks == chunks  # (doc_id, position) ids, texts, offsets
    assert len({(c["doc_id"], c["position"]) for c in ray_chunks}) == len(ray_chunks)  # no duplicates
    np.testing.assert_allclose(ray_vectors, vectors, atol=1e-5)
    return len(chunks)


def test_ray_ingestion_writes_what_one_process_writes_and_upserts(local_ray, embedder, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_ingest, "GROUP_DOCUMENTS", 2)  # several groups, so both workers take some
    corpus = _corpus(tmp_path / "corpus")
    here = DocumentStore(str(tmp_path / "here"), embedder, STORE_SETTINGS)
    there = DocumentStore(str(tmp_path / "there"), embedder, STORE_SETTINGS)

    first = ingest_paths(here, "docs", [corpus], show_progress=False)
    with RayIngestEngine("local", workers=2) as engine:  # its workers (models loaded) last the block
        on_ray = ingest_paths(there, "docs", [corpus], show_progress=False, engine=engine)
        assert sorted(on_ray.added) == sorted(first.added) and len(on_ray.added) == 10
        assert on_ray.chunks_written == first.chunks_written
        assert _assert_same(here, there, "docs") == first.chunks_written > 20

        # a shorter version of one document (its surplus chunks must go), a new one, the rest unchanged
        (corpus / "manual.md").write_text("# Pumps\n\n## 1. Start-up\n\nOpen valve V2 before starting the pump.\n")
        (corpus / "new.txt").write_text("The harbour office opens at nine and closes at five.")
        again = ingest_paths(here, "docs", [corpus], show_progress=False)
        on_ray = ingest_paths(there, "docs", [corpus], show_progress=False, engine=engine)
        assert (on_ray.added, on_ray.updated, len(on_ray.unchanged)) == (["new.txt"], ["manual.md"], 9)
        assert on_ray.chunks_written == again.chunks_written
        _assert_same(here, there, "docs")

        # nothing changed: nothing sent to the workers, nothing written
        assert ingest_paths(there, "docs", [corpus], show_progress=False, engine=engine).chunks_written == 0
    with RayIngestEngine("local", workers=2) as engine:  # and a fresh engine starts no worker for it
        assert ingest_paths(there, "docs", [corpus], show_progress=False, engine=engine).chunks_written == 0
        assert engine._actors is None
    _assert_same(here, there, "docs")
    assert ray.is_initialized()  # a Ray this process had connected stays connected
