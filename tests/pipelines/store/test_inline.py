import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pipelines.cancellation import Cancelled
from pipelines.documents import Document
from pipelines.embedding import Embedder
from pipelines.scope import SHARED
from pipelines.settings import ChunkingSettings, RagSettings
from pipelines.store import DocumentStore, IngestCancelled
from tests.support.pipelines import STORE_SETTINGS as SETTINGS
from tests.support.pipelines import distractor_documents, manual_document


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
    first, _second = one.inline_collection(a), two.inline_collection(b)
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

    settings = RagSettings(
        inline_cache_collections=1,
        inline_cache_idle_seconds=0,
        chunking=ChunkingSettings(chunk_tokens=64, chunk_overlap=8),
    )
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


class GatedEmbedder(Embedder):
    """Embeds document texts only once `gate` is set (a slow ingestion held open); questions at once."""

    def __init__(self, inner: Embedder):
        super().__init__(inner.model_path, inner.batch_size)
        self._inner = inner
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def embed(self, texts, should_stop=None):
        self.waiting.set()
        assert self.gate.wait(120), "the gate was never opened"
        return self._inner.embed(texts, should_stop=should_stop)

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
    real_write, attempts = store.inline._write_usage, []

    def conflicting(names, used_at):
        attempts.append(names)
        if len(attempts) == 1:
            raise RuntimeError("lance error: Commit conflict for version 7")  # another process wrote at once
        real_write(names, used_at)

    monkeypatch.setattr(store.inline, "_write_usage", conflicting)
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


def test_an_inline_collection_held_in_another_embedding_space_is_embedded_again(tmp_path, fp32_embedder):
    """A gateway whose embedder changed (backend onnx-int8, another model) does not answer from the vectors another
    space left: the collection, same name, is embedded again in its own space."""
    from tests.support.pipelines import CountingEmbedder

    docs = [manual_document()]
    fp32 = DocumentStore(str(tmp_path / "db"), fp32_embedder, SETTINGS)
    name = fp32.inline_collection(docs)
    int8 = DocumentStore(str(tmp_path / "db"), CountingEmbedder(Embedder(backend="onnx-int8")), SETTINGS)
    assert int8.inline_collection(docs) == name and int8.embedder.texts_embedded > 0
    rows = int8.db.open_table(name + "__docs").search().select(["embedding_space"]).limit(None).to_list()
    assert [r["embedding_space"] for r in rows] == [int8.embedder.space]
    embedded = int8.embedder.texts_embedded
    assert int8.inline_collection(docs) == name and int8.embedder.texts_embedded == embedded  # held now


class _HeldRuns:
    """The real embedder's model runs, the first one held open until `go` is set (an ingestion under way)."""

    def __init__(self, embedder, monkeypatch):
        model = embedder._inner._documents
        real = model._run
        self.runs, self.started, self.go = [], threading.Event(), threading.Event()

        def run(inputs):
            if not self.runs:
                self.started.set()
                assert self.go.wait(60), "never released"
            self.runs.append(len(inputs["input_ids"]))
            return real(inputs)

        monkeypatch.setattr(model, "_run", run)


def _new_documents() -> list[Document]:
    return [
        Document(f"n{i}", " ".join(f"entry {j} of file {i} reads {j * 7 + i}." for j in range(200))) for i in (1, 2)
    ]


def _in_request(work):
    """work(flag) in a thread of its own, inside its own request's cancel scope; returns (thread, flag, outcome)."""
    from pipelines.cancellation import cancel_scope

    outcome, ready = {}, threading.Event()
    flags = []

    def run():
        with cancel_scope() as flag:
            flags.append(flag)
            ready.set()
            try:
                outcome["value"] = work()
            except BaseException as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert ready.wait(10)
    return thread, flags[0], outcome


def _waiters(store, name: str) -> int:
    entry = store.inline._ingesting._locks.get(name)
    return 0 if entry is None else len(entry[1])


def test_an_ingestion_another_waiting_request_needs_goes_on_when_its_starter_leaves(store, embedder, monkeypatch):
    """Single flight: two requests with the same new documents, one ingestion. The one doing it leaves: the
    ingestion goes on for the other (not stopped, then begun again by it), and nothing is embedded twice."""
    docs = _new_documents()
    name = store.inline_name(docs)
    held = _HeldRuns(embedder, monkeypatch)
    first, first_left, first_outcome = _in_request(lambda: store.inline_collection(docs))
    assert held.started.wait(60)
    second, _, second_outcome = _in_request(lambda: store.inline_collection(docs))
    deadline = time.monotonic() + 10
    while _waiters(store, name) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first_left.set()  # its client left mid-ingestion
    held.go.set()
    first.join(120), second.join(120)
    assert second_outcome == {"value": name} and first_outcome == {"value": name}
    assert store.inline.holds(name, docs)
    assert embedder.texts_embedded == sum(held.runs) == store.collection(name).chunk_count  # embedded once


def test_a_request_that_leaves_while_waiting_for_an_ingestion_stops_at_once_and_the_last_one_stops_it(
    store, embedder, monkeypatch
):
    docs = _new_documents()
    name = store.inline_name(docs)
    held = _HeldRuns(embedder, monkeypatch)
    first, first_left, first_outcome = _in_request(lambda: store.inline_collection(docs))
    assert held.started.wait(60)
    second, second_left, second_outcome = _in_request(lambda: store.inline_collection(docs))
    deadline = time.monotonic() + 10
    while _waiters(store, name) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second_left.set()
    second.join(5)
    assert not second.is_alive() and isinstance(second_outcome.get("error"), Cancelled)  # did not queue behind it
    first_left.set()  # now nobody wants it
    held.go.set()
    first.join(60)
    assert isinstance(first_outcome.get("error"), IngestCancelled)
    assert len(held.runs) == 1  # stopped before its second model run
    assert not store.inline.holds(name, docs)


def test_an_ingestion_nobody_waits_for_stops_when_its_only_request_leaves_and_leaves_no_half_document(
    store, embedder, monkeypatch
):
    """Single flight keeps an ingestion going while another request waits for it (above). With nobody else waiting,
    the request's leaving stops it before its next model run (mend8), and the collection is left without any
    document whose chunks are not all there, so the next request for the same documents embeds them whole."""
    docs = _new_documents()
    name = store.inline_name(docs)
    held = _HeldRuns(embedder, monkeypatch)
    alone, left, outcome = _in_request(lambda: store.inline_collection(docs))
    assert held.started.wait(60)
    assert _waiters(store, name) == 1
    left.set()  # its client left mid-ingestion, nobody else wants it
    held.go.set()
    alone.join(60)
    assert not alone.is_alive() and isinstance(outcome.get("error"), IngestCancelled)
    assert len(held.runs) == 1  # stopped before its second model run
    assert not store.inline.holds(name, docs)
    info = store.collection(name)
    stored = {d.id for d in info.documents} if info is not None else set()
    runs_before = len(held.runs)
    again, _, again_outcome = _in_request(lambda: store.inline_collection(docs))
    again.join(120)
    assert again_outcome == {"value": name} and store.inline.holds(name, docs)
    assert len(held.runs) > runs_before  # embedded by the next request
    whole = store.chunk_vectors(name, {d.id for d in docs})
    for doc_id in stored:  # any document row the stopped ingestion left had every chunk the whole one has
        assert doc_id in whole
    assert not stored  # here: stopped before any batch was written
