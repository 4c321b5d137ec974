import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.documents import Document
from pipelines.embedding import Embedder
from pipelines.ingest import ingest_paths
from pipelines.scope import SHARED
from pipelines.settings import ChunkingSettings, RagSettings
from pipelines.store import DocumentStore, IngestCancelled, validate_collection_name
from tests.pipelines_fixtures import MANUAL_PATH, CountingEmbedder, distractor_documents, manual_document

SETTINGS = RagSettings(chunking=ChunkingSettings(chunk_tokens=64, chunk_overlap=8), top_k=5)


@pytest.fixture(scope="module")
def base_embedder():
    return Embedder()


@pytest.fixture
def embedder(base_embedder):
    return CountingEmbedder(base_embedder)


@pytest.fixture
def store(tmp_path, embedder):
    return DocumentStore(str(tmp_path / "db"), embedder, SETTINGS)


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


def test_collection_names_are_validated(store):
    for bad in ["", "a/b", "../x", "white space", "semi;colon", ".hidden", "x" * 129, "abc\n", "..", "/etc",
                "a\\b", "%2e%2e", "\uff0e\uff0e", "caf\u00e9", "a\x00b"]:
        with pytest.raises(ValueError, match="invalid collection name"):
            validate_collection_name(bad)
        with pytest.raises(ValueError):
            store.ingest(bad, [manual_document()])
    assert validate_collection_name("Contracts-2024_v1.2") == "Contracts-2024_v1.2"


def test_inline_collection_is_cached_by_content(store, embedder):
    docs = [Document("a", "The vault code is 4417. It changes every March.")]
    name = store.inline_collection(docs)
    calls = embedder.texts_embedded
    assert calls > 0 and store.is_inline(name)
    assert store.inline_collection([Document("a", "The vault code is 4417. It changes every March.")]) == name
    assert embedder.texts_embedded == calls  # neither re-chunked nor re-embedded
    other = store.inline_collection([Document("a", "The vault code is 9999.")])
    assert other != name and embedder.texts_embedded > calls


def inline_names(store) -> set[str]:
    return {info.name for info in store.collections() if store.is_inline(info.name)}


def test_inline_collections_are_capped_over_the_whole_store_least_recently_used_first(tmp_path, embedder):
    """Two stores on one directory are two replicas on one bucket: the cap counts every inline collection in the
    store and the order of use is the store's, not each process's."""
    settings = RagSettings(inline_cache_collections=2, inline_cache_idle_seconds=0)
    one, two = (DocumentStore(str(tmp_path / "db"), embedder, settings) for _ in range(2))
    a, b, c, d = ([Document("d", f"Fact number {n} is recorded here.")] for n in (1, 2, 3, 4))
    first, second = one.inline_collection(a), two.inline_collection(b)
    one.inline_collection(b)
    two.inline_collection(a)  # used again, through the other replica: now b is the least recently used
    third = one.inline_collection(c)
    assert inline_names(two) == {first, third}
    fourth = two.inline_collection(d)  # the other replica drops a, used before c: never two per replica
    assert inline_names(one) == {third, fourth}


def test_an_inline_collection_used_within_the_idle_period_is_kept_past_the_cap(tmp_path, embedder, monkeypatch):
    settings = RagSettings(inline_cache_collections=1, inline_cache_idle_seconds=600)
    one, two = (DocumentStore(str(tmp_path / "db"), embedder, settings) for _ in range(2))
    a, b, c = ([Document("d", f"Fact number {n} is recorded here.")] for n in (1, 2, 3))
    first = one.inline_collection(a)
    second = two.inline_collection(b)
    assert inline_names(one) == {first, second}  # a was used a moment ago, by another replica: kept
    later = time.time() + 601
    monkeypatch.setattr(time, "time", lambda: later)
    one.inline_collection(b)  # in use again (a new record: the last was over the refresh interval ago)
    third = two.inline_collection(c)
    assert inline_names(one) == {second, third}  # a went idle and goes; b, used just now, stays past the cap


def test_a_reader_whose_inline_collection_another_replica_dropped_embeds_it_again(tmp_path, embedder):
    """The race the cap used to lose: replica one has its attached documents' inline collection, replica two drops
    it before one reads it (no idle period here; with one, a read slower than it or a clock ahead). The RAG
    retrieval and the long route's scoring read it again instead of failing."""
    from pipelines.base import ContextRequest
    from pipelines.long_context import LongContextPipeline
    from pipelines.rag import RagPipeline

    settings = RagSettings(inline_cache_collections=1, inline_cache_idle_seconds=0,
                           chunking=ChunkingSettings(chunk_tokens=64, chunk_overlap=8))
    one, two = (DocumentStore(str(tmp_path / "db"), embedder, settings) for _ in range(2))
    vault = [Document("vault", "The vault code is 4417. It changes every March.")]
    other = [Document("gate", "The harbour gate opens at six in the morning.")]
    ready = one.inline_collection(vault)
    real = one.inline_collection
    drops = []

    def then_dropped_by_the_other_replica(docs, should_stop=None, scope=SHARED):
        name = real(docs, should_stop, scope)
        if not drops:  # once: the documents are embedded again and read
            drops.append(name)
            two.inline_collection(other)  # its one-collection cap drops the vault's, which it found in the store
            assert two.collection(name) is None
        return name

    one.inline_collection = then_dropped_by_the_other_replica
    request = ContextRequest("What is the vault code?", [], documents=vault)
    prompt = RagPipeline(one, settings).prepare(request)
    assert drops == [ready] and "4417" in prompt.messages[-1]["content"]
    assert one.collection(ready) is not None  # embedded again, and kept

    drops.clear()
    long_route = LongContextPipeline(store=one)
    scorer = long_route._scorer(vault, None)
    [score] = scorer("What is the vault code?", list(long_route.unit_cache.get(vault[0], long_route.settings).units))
    assert drops == [ready] and score > 0.3  # scored from the vectors embedded again, not left unscored

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
    small_batches._documents._model = base_embedder.model  # the same loaded model, smaller batches
    store = DocumentStore(str(tmp_path / "db"), small_batches, SETTINGS)
    docs = [manual_document(), *distractor_documents()]
    planned, done = [], []
    report = store.ingest("docs", docs, progress=done.append, planned=planned.append)
    assert sum(planned) == sum(done) == report.chunks_written > 8
    assert len(done) > 1 and max(done) <= 8  # steady steps of batch_size x 4, not one jump at the end
    planned, done = [], []
    store.ingest("docs", docs, progress=done.append, planned=planned.append)
    assert planned == [] and done == []  # unchanged documents: nothing to embed


class GatedEmbedder(Embedder):
    """Embeds document texts only once `gate` is set (a slow ingestion held open); questions at once."""

    def __init__(self, inner: Embedder):
        super().__init__(inner.model_path, inner.batch_size)
        self._inner = inner
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def embed(self, texts):
        self.waiting.set()
        assert self.gate.wait(120), "the gate was never opened"
        return self._inner.embed(texts)

    def embed_queries(self, texts):
        return self._inner.embed_queries(texts)

    @property
    def dimension(self) -> int:
        return self._inner.dimension


def test_requests_on_ingested_documents_do_not_wait_for_another_ingestion(tmp_path, base_embedder):
    gated = GatedEmbedder(base_embedder)
    store = DocumentStore(str(tmp_path / "db"), gated, SETTINGS)
    gated.gate.set()
    ready = store.inline_collection([manual_document()])
    store.ingest("named", distractor_documents())
    gated.gate.clear()
    gated.waiting.clear()
    with ThreadPoolExecutor(max_workers=2) as pool:
        slow = pool.submit(store.inline_collection, [Document("new", "A document whose embedding is held up.")])
        other = pool.submit(store.ingest, "named", [Document("late", "Another document held up too.")])
        assert gated.waiting.wait(60)
        # meanwhile: the ingested documents answer, and a collection write of another kind goes through
        assert store.inline_collection([manual_document()]) == ready
        assert "HP-IK-2231" in store.search(ready, "replacement impeller kit part number", 3)[0].chunk.text
        assert store.delete_document("named", distractor_documents()[0].id)
        assert not slow.done() and not other.done()
        gated.gate.set()
        assert store.collection(slow.result(60)).documents[0].id == "new"
        assert other.result(60).added == ["late"]


def test_a_cancelled_ingestion_stops_between_batches(store, embedder):
    docs = [Document(f"d{i}", " ".join(f"word{j} of document {i}." for j in range(400))) for i in range(3)]
    with pytest.raises(IngestCancelled):
        store.ingest("cancelled", docs, should_stop=lambda: True)
    assert embedder.texts_embedded == 0


_WRITER = r"""
import hashlib, json, sys, time
from pathlib import Path
import numpy as np
from pipelines.documents import Document
from pipelines.settings import ChunkingSettings, RagSettings
from pipelines.store import DocumentStore

class HashEmbedder:
    # deterministic vectors: what is under test is the store's writes, not the model
    dimension, batch_size = 16, 64
    def embed(self, texts):
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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, json.dumps({"uri": uri, "ready": str(tmp_path / tag),
                                                                     "go": str(go), "n": n})],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


def test_an_inline_collection_dropped_while_it_is_being_read_is_read_again(tmp_path, embedder):
    """The other replica drops it after the reader opened its tables: LanceDB's not-found error is the store's
    CollectionNotFound, and the reader embeds the documents again instead of failing."""
    from pipelines.base import ContextRequest
    from pipelines.rag import RagPipeline

    one, two = (DocumentStore(str(tmp_path / "db"), embedder, SETTINGS) for _ in range(2))
    vault = [Document("vault", "The vault code is 4417. It changes every March.")]
    name = one.inline_collection(vault)
    real_tables = one._tables
    dropped = []

    def opened_then_dropped(collection, create=False):
        tables = real_tables(collection, create)
        if collection == name and not create and not dropped:
            dropped.append(collection)
            two.delete_collection(collection)
        return tables

    one._tables = opened_then_dropped
    retrieval = RagPipeline(one, SETTINGS).retrieve_for(ContextRequest("What is the vault code?", [], documents=vault))
    assert dropped == [name] and any("4417" in p.text for p in retrieval.passages)
    assert one.collection(name) is not None


def test_a_failed_usage_record_is_logged_and_tried_again_not_raised(tmp_path, embedder, monkeypatch, caplog):
    store = DocumentStore(str(tmp_path / "db"), embedder, RagSettings(inline_cache_idle_seconds=600))
    docs = [Document("a", "The vault code is 4417.")]
    real_write, attempts = store._write_usage, []

    def conflicting(names, used_at):
        attempts.append(names)
        if len(attempts) == 1:
            raise RuntimeError("lance error: Commit conflict for version 7")  # another process wrote at once
        real_write(names, used_at)

    monkeypatch.setattr(store, "_write_usage", conflicting)
    name = store.inline_collection(docs)
    assert store.collection(name) is not None and "could not record the use" in caplog.text
    assert store.inline_collection(docs) == name and len(attempts) == 2  # not taken for recorded: tried again


def test_inline_names_are_keyed_by_a_secret_the_store_keeps(tmp_path, embedder):
    """Two stores on one directory (two replicas on one bucket) name the same documents alike, made at the same
    moment too; another store names them differently, so the name cannot be computed from the documents alone.
    On a local store the secret's files are the owner's alone."""
    import os
    import stat
    from concurrent.futures import ThreadPoolExecutor

    docs = [Document("a", "The vault code is 4417.")]
    replicas = [DocumentStore(str(tmp_path / "shared"), embedder) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        names = set(pool.map(lambda s: s.inline_name(docs), replicas))
    assert len(names) == 1
    assert DocumentStore(str(tmp_path / "shared"), embedder).inline_name(docs) in names  # a restart: the same
    assert DocumentStore(str(tmp_path / "other"), embedder).inline_name(docs) not in names
    root = tmp_path / "shared" / "selfroute-inline-secret.lance"
    modes = {stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) for d, _, fs in os.walk(root) for f in fs}
    assert modes == {0o600}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert "selfroute-inline-secret" not in {c.name for c in replicas[0].collections()}


def test_inline_collection_names_are_reserved_for_the_gateway(store):
    from pipelines.store import check_writable_name

    with pytest.raises(ValueError, match="reserved"):
        check_writable_name("inline-0123456789abcdef")
    assert check_writable_name("contracts") == "contracts"
