import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipelines.cancellation import cancel_scope
from pipelines.documents import Document
from pipelines.embedding import Embedder
from pipelines.ingest import ingest_paths
from pipelines.store import DocumentStore, IngestCancelled
from tests.support.pipelines import MANUAL_PATH, CountingEmbedder, distractor_documents, manual_document
from tests.support.pipelines import STORE_SETTINGS as SETTINGS


def chunk_rows(store, collection):
    return store.db.open_table(collection + "__chunks").count_rows()


def test_retrieval_finds_planted_answer(store):
    report = store.ingest("docs", [manual_document(), *distractor_documents()])
    assert len(report.added) == 6 and report.chunks_written == chunk_rows(store, "docs")
    hits = store.search("docs", "What is the part number of the replacement impeller kit?", 5)
    assert hits[0].chunk.doc_id == "manual.md" and "HP-IK-2231" in hits[0].chunk.text
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert all(hits[i].score >= hits[i + 1].score for i in range(len(hits) - 1))
    assert all(-1.0 <= h.vector_score <= 1.0 for h in hits)
    assert hits[0].vector_rank is not None and hits[0].text_rank is not None  # found both ways
    # keyword-only hits still carry their true cosine similarity
    top = store.embedder.embed(["What is the part number of the replacement impeller kit?"])[0]
    vec = store.embedder.embed([hits[0].chunk.text])[0]
    assert abs(float(top @ vec) - hits[0].vector_score) < 1e-3


def test_full_text_side_finds_rare_token(store):
    store.ingest("docs", [manual_document(), *distractor_documents()])
    hits = store.search("docs", "HP-SL-0907", 3)
    assert any("HP-SL-0907" in h.chunk.text and h.text_rank == 1 for h in hits)


def test_ingest_is_idempotent(store, embedder):
    docs = [manual_document(), *distractor_documents()]
    store.ingest("docs", docs)
    rows, embedded = chunk_rows(store, "docs"), embedder.texts_embedded
    version = store.db.open_table("docs__chunks").version
    again = store.ingest("docs", docs)
    assert again.added == [] and again.updated == [] and sorted(again.unchanged) == sorted(d.id for d in docs)
    assert again.chunks_written == 0
    assert chunk_rows(store, "docs") == rows and embedder.texts_embedded == embedded
    assert store.db.open_table("docs__chunks").version == version


def test_changed_document_replaces_old_version(store):
    doc = manual_document()
    store.ingest("docs", [doc, *distractor_documents()])
    before = store.collection("docs")
    changed = replace(doc, text=doc.text.replace("HP-IK-2231", "HP-IK-9999"))
    report = store.ingest("docs", [changed])
    assert report.updated == ["manual.md"] and report.added == []
    after = store.collection("docs")
    assert after.chunk_count == before.chunk_count == chunk_rows(store, "docs")
    texts = [h.chunk.text for h in store.search("docs", "replacement impeller kit part number", 3)]
    assert any("HP-IK-9999" in t for t in texts) and not any("HP-IK-2231" in t for t in texts)
    assert "HP-IK-9999" in store.documents("docs", ["manual.md"])[0].text


def test_delete_document(store):
    store.ingest("docs", [manual_document(), *distractor_documents()])
    n_manual = next(d.chunks for d in store.collection("docs").documents if d.id == "manual.md")
    rows = chunk_rows(store, "docs")
    assert store.delete_document("docs", "manual.md") is True
    assert store.delete_document("docs", "manual.md") is False
    assert store.delete_document("missing-collection", "manual.md") is False
    assert chunk_rows(store, "docs") == rows - n_manual
    assert "manual.md" not in [d.id for d in store.documents("docs")]
    assert all(h.chunk.doc_id != "manual.md" for h in store.search("docs", "impeller part number", 5))


def test_collection_info(store):
    store.ingest("docs", [manual_document()])
    store.ingest("other", distractor_documents()[:2])
    names = [c.name for c in store.collections()]
    assert names == ["docs", "other"]
    (info,) = store.collection("docs").documents
    assert info.id == "manual.md" and info.title == "Harbor Pump Operations Manual"
    assert info.cross_refs == 7 and "4.2 Spare parts" in info.sections and info.chunks > 3
    assert info.tokens > 300
    json.dumps(store.collection("docs").to_dict())
    assert store.collection("nothing-here") is None
    assert store.documents("docs")[0].text == MANUAL_PATH.read_text()


def test_collections_can_leave_inline_ones_out_without_reading_them(store, monkeypatch):
    store.ingest("docs", distractor_documents()[:1])
    inline = store.inline_collection([Document("a", "The vault code is 4417.")])
    assert [c.name for c in store.collections()] == ["docs", inline]
    read = []
    real_collection = store.collection
    monkeypatch.setattr(store, "collection", lambda name: read.append(name) or real_collection(name))
    assert [c.name for c in store.collections(include_inline=False)] == ["docs"]
    assert read == ["docs"]


def test_ingest_paths_and_concurrent_search(store, tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "manual.md").write_text(MANUAL_PATH.read_text())
    (folder / "notes.txt").write_text("The harbour master's office opens at nine.")
    report = ingest_paths(store, "files", [folder], show_progress=False)
    assert sorted(report.added) == ["manual.md", "notes.txt"]
    assert ingest_paths(store, "files", [folder], show_progress=False).unchanged == report.added
    questions = ["When does the harbour office open?", "How close to the battery must the fuse be placed?"] * 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda q: store.search("files", q, 2)[0].chunk.text, questions))
    assert all("nine" in r for r in results[0::2]) and all("18 centimetres" in r for r in results[1::2])


def test_ingest_progress_counts_chunks_as_they_are_embedded(tmp_path, base_embedder):
    small_batches = Embedder(base_embedder.model_path, batch_size=2)
    # the same loaded model (whichever backend), smaller batches
    small_batches._documents = small_batches._queries_model = base_embedder._documents
    store = DocumentStore(str(tmp_path / "db"), small_batches, SETTINGS)
    docs = [manual_document(), *distractor_documents()]
    planned, done = [], []
    report = store.ingest("docs", docs, progress=done.append, planned=planned.append)
    assert sum(planned) == sum(done) == report.chunks_written > 8
    assert len(done) > 1 and max(done) <= 8  # steady steps of batch_size x 4, not one jump at the end
    planned, done = [], []
    store.ingest("docs", docs, progress=done.append, planned=planned.append)
    assert planned == [] and done == []  # unchanged documents: nothing to embed


def test_a_cancelled_ingestion_stops_between_batches(store, embedder):
    docs = [Document(f"d{i}", " ".join(f"word{j} of document {i}." for j in range(400))) for i in range(3)]
    with pytest.raises(IngestCancelled):
        store.ingest("cancelled", docs, should_stop=lambda: True)
    assert embedder.texts_embedded == 0


_WRITER = r"""
import hashlib, json, sys, time
from pathlib import Path
import numpy as np
from pipelines.cancellation import cancel_scope
from pipelines.documents import Document
from pipelines.settings import ChunkingSettings, RagSettings
from pipelines.store import DocumentStore

class HashEmbedder:
    # deterministic vectors: what is under test is the store's writes, not the model
    dimension, batch_size, space = 16, 64, "hash-16"
    def embed(self, texts, should_stop=None):
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], np.uint8).astype(np.float32) + 1 for t in texts]
        vectors = np.stack(rows) if rows else np.zeros((0, 16), np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    embed_queries = embed
    def embed_query(self, text):
        return self.embed([text])[0]

a = json.loads(sys.argv[1])
store = DocumentStore(a["uri"], HashEmbedder(), RagSettings(chunking=ChunkingSettings(chunk_tokens=32, chunk_overlap=4)))
store.ingest("shared", [])  # both processes open (or create) the tables before the start
Path(a["ready"]).touch()
while not Path(a["go"]).exists():
    time.sleep(0.002)
for i in range(a["n"]):  # one document per ingest: many commits, interleaved with the other writer's
    store.ingest("shared", [Document(f"doc-{i}", " ".join(f"Sentence {j} of document {i}." for j in range(60)))])
print("done")
"""


def test_two_writer_processes_leave_no_duplicates(tmp_path):
    uri, go, n = str(tmp_path / "db"), tmp_path / "go", 12
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WRITER,
                json.dumps({"uri": uri, "ready": str(tmp_path / tag), "go": str(go), "n": n}),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    deadline = time.monotonic() + 300
    while not all((tmp_path / tag).exists() for tag in ("a", "b")):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.monotonic() < deadline, "writers did not start"
        time.sleep(0.01)
    go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0 and "done" in out, err[-3000:]
    import lancedb

    db = lancedb.connect(uri)
    docs = db.open_table("shared__docs").to_arrow()
    chunks = db.open_table("shared__chunks").to_arrow().select(["doc_id", "position"]).to_pylist()
    assert sorted(docs["id"].to_pylist()) == sorted(f"doc-{i}" for i in range(n))
    keys = [(c["doc_id"], c["position"]) for c in chunks]
    assert len(keys) == len(set(keys)) == sum(docs["chunks"].to_pylist())


def test_names_and_ids_never_leave_the_store_directory(tmp_path, embedder):
    """Collection names cannot name a path (validated before any table is touched); document ids are values in a
    table, never part of a path: every file the store writes is under its own directory."""
    root = tmp_path / "inside"
    store = DocumentStore(str(root / "db"), embedder, SETTINGS)
    for bad in ["../outside", "..", "/tmp/outside", "a/../../outside", "abc\n", "..\\outside", "%2e%2e%2foutside"]:
        with pytest.raises(ValueError):
            store.ingest(bad, [Document("d", "text")])
    evil_ids = ["../../../outside.txt", "/etc/passwd", "..\\..\\x", "a' OR '1'='1", "x\\' OR 1=1 --"]
    store.ingest("docs", [Document(i, f"Document number {n}.") for n, i in enumerate(evil_ids)])
    assert [d.id for d in store.documents("docs", evil_ids)] == evil_ids  # the quoting held: each found by its id
    assert store.delete_document("docs", "a' OR '1'='1") and len(store.documents("docs")) == len(evil_ids) - 1
    assert [p.name for p in tmp_path.iterdir()] == ["inside"]
    assert all(p.resolve().is_relative_to((root / "db").resolve()) for p in root.rglob("*") if p.is_file())


def test_names_and_ids_never_leave_the_bucket_prefix(s3_bucket, monkeypatch, embedder):
    for name, value in s3_bucket.env.items():
        monkeypatch.setenv(name, value)
    store = DocumentStore(s3_bucket.uri, embedder, SETTINGS)
    for bad in ["../outside", "..", "/outside", "a/../../outside", "abc\n"]:
        with pytest.raises(ValueError):
            store.ingest(bad, [Document("d", "text")])
    store.ingest("docs", [Document("../../../outside", "A document whose id looks like a path.")])
    assert [d.id for d in store.documents("docs")] == ["../../../outside"]
    keys = [o["Key"] for o in s3_bucket.client().list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]]
    assert keys and all(k.startswith(f"{s3_bucket.prefix}/docs__") for k in keys), keys


def test_a_document_whose_id_holds_a_backslash_and_a_quote_is_found_and_deleted(store):
    odd = "x\\' OR 1=1 --"
    store.ingest("docs", [Document(odd, "An oddly named document."), Document("plain", "Another document.")])
    assert [d.id for d in store.documents("docs", [odd])] == [odd]
    assert store.delete_document("docs", odd) is True and store.delete_document("docs", odd) is False
    assert [d.id for d in store.documents("docs")] == ["plain"]


def _spaces(store, collection) -> dict[str, str | None]:
    table = store.db.open_table(collection + "__docs")
    rows = table.search().select(["id", "embedding_space"]).limit(None).to_list()
    return {r["id"]: r["embedding_space"] for r in rows}


def _vectors(store, collection) -> np.ndarray:
    table = (
        store.db.open_table(collection + "__chunks")
        .to_arrow()
        .sort_by([("doc_id", "ascending"), ("position", "ascending")])
    )
    return table["vector"].combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)


def _reembedding_across_spaces(uri: str, fp32_embedder) -> None:
    base_embedder = fp32_embedder  # what stores held before round eight's onnx-int8 default
    docs = [manual_document(), *distractor_documents()[:2]]
    ids = sorted(d.id for d in docs)
    fp32 = DocumentStore(uri, CountingEmbedder(base_embedder), SETTINGS)
    first = fp32.ingest("docs", docs)
    assert sorted(first.added) == ids and set(_spaces(fp32, "docs").values()) == {base_embedder.space}
    before = _vectors(fp32, "docs")
    # torch runs the same fp32 weights: the same space, nothing embedded again
    torch = DocumentStore(uri, CountingEmbedder(Embedder(backend="torch")), SETTINGS)
    assert torch.embedder.space == base_embedder.space
    assert sorted(torch.ingest("docs", docs).unchanged) == ids and torch.embedder.texts_embedded == 0
    # int8 weights are another space: every document is embedded again, replaced in place (no duplicates)
    int8 = DocumentStore(uri, CountingEmbedder(Embedder(backend="onnx-int8")), SETTINGS)
    assert int8.embedder.space != base_embedder.space
    again = int8.ingest("docs", docs)
    assert sorted(again.updated) == ids and again.chunks_written == first.chunks_written
    assert set(_spaces(int8, "docs").values()) == {int8.embedder.space}
    after = _vectors(int8, "docs")
    assert after.shape == before.shape and not np.allclose(after, before, atol=1e-4)
    assert np.allclose(after, int8.embedder.embed([c.text for c in _chunks_in_order(int8, "docs")]), atol=1e-5)
    assert sorted(int8.ingest("docs", docs).unchanged) == ids  # now in its space: skipped


def _chunks_in_order(store, collection):
    from pipelines.chunk_search import row_chunk

    table = (
        store.db.open_table(collection + "__chunks")
        .to_arrow()
        .sort_by([("doc_id", "ascending"), ("position", "ascending")])
    )
    return [row_chunk(r) for r in table.to_pylist()]


def test_a_document_stored_in_another_embedding_space_is_embedded_again(tmp_path, fp32_embedder):
    _reembedding_across_spaces(str(tmp_path / "db"), fp32_embedder)


def test_a_document_stored_in_another_embedding_space_is_embedded_again_on_s3(s3_bucket, monkeypatch, fp32_embedder):
    for name, value in s3_bucket.env.items():
        monkeypatch.setenv(name, value)
    _reembedding_across_spaces(s3_bucket.uri, fp32_embedder)


def test_rows_written_before_spaces_were_recorded_are_the_packaged_models_fp32_space(tmp_path, fp32_embedder):
    """What every release wrote by default (torch, then onnx): kept by an fp32 embedder of the packaged model, embedded
    again by an int8 one; an older table gets the column first."""
    embedder = CountingEmbedder(fp32_embedder)
    store = DocumentStore(str(tmp_path / "db"), embedder, SETTINGS)
    docs = [manual_document(), *distractor_documents()[:2]]
    ids = sorted(d.id for d in docs)
    store.ingest("docs", docs)
    store.db.open_table("docs__docs").drop_columns(["embedding_space"])  # as an earlier release wrote it
    assert "embedding_space" not in store.db.open_table("docs__docs").schema.names
    embedded = embedder.texts_embedded
    assert sorted(store.ingest("docs", docs).unchanged) == ids and embedder.texts_embedded == embedded
    assert set(_spaces(store, "docs").values()) == {None}  # the column is back, the rows as they were
    int8 = DocumentStore(str(tmp_path / "db"), CountingEmbedder(Embedder(backend="onnx-int8")), SETTINGS)
    assert sorted(int8.ingest("docs", docs).updated) == ids and int8.embedder.texts_embedded > 0
    assert set(_spaces(int8, "docs").values()) == {int8.embedder.space}


def _count_model_runs(embedder, monkeypatch, after_first=None):
    """Counts the onnxruntime runs of the real embedder's document session; `after_first()` runs once, after the
    first run (inside it, as if the client left mid-run)."""
    model = embedder._inner._documents
    real = model._run
    runs = []

    def counted(inputs):
        runs.append(len(inputs["input_ids"]))
        out = real(inputs)
        if len(runs) == 1 and after_first is not None:
            after_first()
        return out

    monkeypatch.setattr(model, "_run", counted)
    return runs


def test_a_request_that_leaves_mid_slice_stops_before_the_next_model_run(store, embedder, monkeypatch):
    """The request's cancel scope (pipelines.cancellation) is asked before every model run (a few chunks), not only
    between slices of batch_size x 4 chunks: a slice took minutes on loaded cores beside other ingestions."""
    docs = [Document(f"d{i}", " ".join(f"word{j} of document {i} says {j * i}." for j in range(300))) for i in range(3)]
    with cancel_scope() as flag:
        runs = _count_model_runs(embedder, monkeypatch, after_first=flag.set)
        with pytest.raises(IngestCancelled):
            store.ingest("left", docs)
    assert len(runs) == 1  # the rest of the first slice (~8 more runs) was never started
    assert store.collection("left") is None or chunk_rows(store, "left") == 0
    runs.clear()
    report = store.ingest("left", docs)  # nothing half-written is taken for done: embedded whole next time
    assert report.chunks_written > 2 * 64 and sum(runs) == report.chunks_written
