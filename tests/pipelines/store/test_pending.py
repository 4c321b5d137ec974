"""The first pass over new attached documents (pipelines.store.pending): the first questions are answered from BM25
candidates while one background ingestion per inline collection embeds everything into the same collection."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipelines.base import INDEX_FULL, INDEX_PARTIAL, ContextRequest
from pipelines.documents import Document
from pipelines.rag import RagPipeline
from pipelines.scope import SHARED, KeyScope
from pipelines.store import DocumentStore
from pipelines.store import pending as pending_module
from tests.support.pipelines import STORE_SETTINGS, SlowEmbedder, distractor_documents, manual_document

# a logbook, so that the documents hold more chunks than one first pass embeds
LOGBOOK = Document(
    "logbook.md",
    "# Harbour logbook\n\n"
    + "\n\n".join(
        f"## Day {i}\n\nOn day {i} the crew logged a wind of {i % 9} knots, painted hull section {i} and "
        f"checked mooring line {i * 3}. The tide table entry {i} was copied to the office board."
        for i in range(60)
    ),
    title="Harbour logbook",
)
DOCS = [manual_document(), *distractor_documents(), LOGBOOK]


def ask(store: DocumentStore, question: str, docs=DOCS, scope: KeyScope = SHARED):
    rag = RagPipeline(store)
    return rag.retrieve_for(ContextRequest(question, [], documents=docs, scope=scope))


def chunk_rows(store: DocumentStore, name: str) -> list[tuple[str, int]]:
    return sorted((c.doc_id, c.position) for c, _ in store.chunks(name))


def test_the_first_question_is_answered_before_the_documents_are_embedded_then_the_full_index(store, embedder):
    first = ask(store, "What is the part number of the replacement impeller kit?")
    assert first.index == INDEX_PARTIAL
    assert "HP-IK-2231" in first.context_text  # found lexically, ranked with the candidates' vectors
    assert first.hits and all(h.vector_rank is not None for h in first.hits[:3])  # ranked by vector too
    store.wait_inline()
    name = store.inline_name(DOCS)
    assert store.inline.holds(name, DOCS)  # the background ingestion made the same collection, same name
    reference = DocumentStore(store.uri + "-sync", embedder, store.settings)
    expected = chunk_rows(reference, reference.inline_collection(DOCS))
    assert chunk_rows(store, name) == expected  # every chunk, once: no duplicates, none missing
    embedded = embedder.texts_embedded
    later = ask(store, "Which fuse protects the pump motor?")
    assert later.index == INDEX_FULL and "15 ampere fuse" in later.context_text
    assert embedder.texts_embedded == embedded  # nothing embedded again


def test_the_background_ingestion_reuses_the_vectors_the_first_pass_made(store, embedder):
    ask(store, "What is the part number of the replacement impeller kit?")
    candidates = embedder.queries_embedded - 1  # the first pass's chunks, besides the question
    store.wait_inline()
    total = len(chunk_rows(store, store.inline_name(DOCS)))
    assert 0 < candidates < total
    assert embedder.texts_embedded == total - candidates


def test_twenty_concurrent_first_questions_start_one_background_ingestion(tmp_path, base_embedder, monkeypatch):
    embedder = SlowEmbedder(base_embedder, 0.2)
    store = DocumentStore(str(tmp_path / "db"), embedder, STORE_SETTINGS)
    made, ingested = [], []
    real_init, real_ingest = pending_module.PendingInline.__init__, store.ingest

    def counted_init(self, *args, **kwargs):
        made.append(self)
        real_init(self, *args, **kwargs)

    def counted_ingest(*args, **kwargs):
        ingested.append(args[0])
        return real_ingest(*args, **kwargs)

    monkeypatch.setattr(pending_module.PendingInline, "__init__", counted_init)
    monkeypatch.setattr(store, "ingest", counted_ingest)
    questions = [f"What does the manual say about the pump, question {i}?" for i in range(20)]
    with ThreadPoolExecutor(20) as pool:
        found = list(pool.map(lambda q: ask(store, q), questions))
    assert all(r.index == INDEX_PARTIAL for r in found)
    store.wait_inline()
    assert len(made) == 1 and len(ingested) == 1  # one chunking, one ingestion
    name = store.inline_name(DOCS)
    rows = chunk_rows(store, name)
    assert len(rows) == len(set(rows)) == len(made[0].chunks)
    assert ask(store, "Which fuse protects the pump motor?").index == INDEX_FULL


def test_two_keys_never_share_a_first_pass_or_an_inline_collection(store):
    one, two = KeyScope("key-one"), KeyScope("key-two")
    first = store.inline_pending(DOCS, one)
    second = store.inline_pending(DOCS, two)
    assert first is not None and second is not None and first is not second
    assert first.name != second.name == store.inline_name(DOCS, two)
    assert store.inline_pending(DOCS, one) is first  # the same key's next question: the same first pass
    ask(store, "What is the part number of the replacement impeller kit?", scope=one)
    ask(store, "What is the part number of the replacement impeller kit?", scope=two)
    store.wait_inline()
    assert store.inline.holds(first.name, DOCS) and store.inline.holds(second.name, DOCS)


def test_a_failed_background_ingestion_is_started_again_by_the_next_request(store, monkeypatch, caplog):
    real = store.ingest
    failures = []

    def fails_once(*args, **kwargs):
        if not failures:
            failures.append(args[0])
            raise RuntimeError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "ingest", fails_once)
    first = ask(store, "What is the part number of the replacement impeller kit?")
    store.wait_inline()
    assert first.index == INDEX_PARTIAL and failures
    assert "in the background failed" in caplog.text
    name = store.inline_name(DOCS)
    assert not store.inline.holds(name, DOCS)
    again = ask(store, "Which fuse protects the pump motor?")  # no error: a first pass, and the ingestion again
    assert again.index == INDEX_PARTIAL and "15 ampere fuse" in again.context_text
    store.wait_inline()
    assert store.inline.holds(name, DOCS)
    assert ask(store, "Which fuse protects the pump motor?").index == INDEX_FULL


def test_close_stops_the_background_ingestion_and_a_half_made_collection_is_not_taken_for_complete(
    tmp_path, base_embedder
):
    embedder = SlowEmbedder(base_embedder, 0.5)
    settings = STORE_SETTINGS.model_copy(update={"embedding_batch_size": 2})  # many slices to stop between
    store = DocumentStore(str(tmp_path / "db"), embedder, settings)
    embedder.batch_size = 2
    ask(store, "What is the part number of the replacement impeller kit?")
    [pending] = store.inline._pending.values()
    time.sleep(1.0)  # under way
    started = time.perf_counter()
    store.close()
    assert time.perf_counter() - started < 5  # stopped between two small slices, not after everything
    assert pending.state == pending_module.CANCELLED
    assert not store.inline.holds(pending.name, DOCS)
    assert store.inline_pending(DOCS) is None  # a closed store starts nothing: read_inline embeds synchronously
    # the next process on the same directory: not complete, so a new first pass and a new ingestion finish it
    embedder.delay = 0
    after = DocumentStore(str(tmp_path / "db"), embedder, settings)
    assert ask(after, "Which fuse protects the pump motor?").index == INDEX_PARTIAL
    after.wait_inline()
    assert after.inline.holds(pending.name, DOCS)
    rows = chunk_rows(after, pending.name)
    assert len(rows) == len(set(rows)) == len(pending.chunks)


def test_first_pass_off_or_too_many_under_way_embeds_before_answering(tmp_path, embedder, monkeypatch):
    off = DocumentStore(str(tmp_path / "off"), embedder, STORE_SETTINGS.model_copy(update={"first_pass_candidates": 0}))
    assert off.inline_pending(DOCS) is None
    assert ask(off, "Which fuse protects the pump motor?").index == INDEX_FULL
    assert off.inline.holds(off.inline_name(DOCS), DOCS)  # embedded before answering, as before
    monkeypatch.setattr("pipelines.store.inline.MAX_PENDING", 1)
    busy = DocumentStore(str(tmp_path / "busy"), embedder, STORE_SETTINGS)
    assert busy.inline_pending(DOCS) is not None  # created, not started: it counts
    other = [Document("gate", "The harbour gate opens at six in the morning.")]
    assert busy.inline_pending(other) is None
    assert ask(busy, "When does the gate open?", docs=other).index == INDEX_FULL
    busy.close()


def test_many_new_document_sets_at_once_keep_to_the_caps_and_one_key_leaves_room_for_others(
    tmp_path, embedder, monkeypatch
):
    real_chunking = pending_module.chunk_document

    def slow_chunking(*args, **kwargs):  # every caller is past the cap check before the first one registers
        time.sleep(0.3)
        return real_chunking(*args, **kwargs)

    monkeypatch.setattr(pending_module, "chunk_document", slow_chunking)
    store = DocumentStore(str(tmp_path / "db"), embedder, STORE_SETTINGS)
    one, two = KeyScope("key-one"), KeyScope("key-two")
    sets = [[Document(f"note-{i}", f"Harbour note {i}: the crane {i} was serviced.")] for i in range(20)]
    with ThreadPoolExecutor(20) as pool:
        made = list(pool.map(lambda docs: store.inline_pending(docs, one), sets))
    assert sum(p is not None for p in made) == pending_module.MAX_PENDING_PER_KEY == len(store.inline._pending)
    assert store.inline_pending(sets[0], one) is made[0] or made[0] is None  # the same set: the same first pass
    assert store.inline_pending(sets[0], two) is not None  # another key still gets a first pass
    # the process's cap holds under a burst of keys too
    keys = [KeyScope(f"key-{i}") for i in range(3, 23)]
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda scope: store.inline_pending(sets[1], scope), keys))
    assert len(store.inline._pending) == pending_module.MAX_PENDING and not store.inline._reserved
    store.close()


def test_a_first_question_that_fails_before_its_search_still_starts_the_background_ingestion(
    store, embedder, monkeypatch
):
    def fails(*args, **kwargs):
        raise RuntimeError("the question's model failed")

    monkeypatch.setattr(embedder, "embed_query", fails)
    with pytest.raises(RuntimeError):
        ask(store, "Which fuse protects the pump motor?")
    [pending] = store.inline._pending.values()
    assert pending.started  # was left unstarted, holding one of the key's slots for as long as no one asked again
    store.wait_inline()
    assert store.inline.holds(pending.name, DOCS)


def test_a_question_without_terms_gets_the_chunks_embedded_so_far(store):
    found = ask(store, "???")
    assert found.index == INDEX_PARTIAL and found.hits == []
    store.close()


def test_few_candidates_hits_found_by_text_alone_are_embedded_for_their_cosine(tmp_path, embedder):
    settings = STORE_SETTINGS.model_copy(update={"first_pass_candidates": 2})
    store = DocumentStore(str(tmp_path / "db"), embedder, settings)
    found = ask(store, "What is the part number of the replacement impeller kit?")
    assert found.index == INDEX_PARTIAL and "HP-IK-2231" in found.context_text
    assert len(found.hits) == settings.top_k
    assert embedder.queries_embedded - 1 <= 2 + settings.top_k  # the candidates, then only hits without a vector
    assert any(h.vector_rank is None for h in found.hits)  # hits found by text alone
    store.wait_inline()
    stored = {(c.doc_id, c.position): v for c, v in store.chunks(store.inline_name(DOCS))}
    question = embedder.embed_query("What is the part number of the replacement impeller kit?")
    for hit in found.hits:  # every hit's cosine, the text-only ones' too
        assert hit.vector_score == pytest.approx(
            float(stored[(hit.chunk.doc_id, hit.chunk.position)] @ question), abs=1e-4
        )


def test_a_background_ingestion_waits_between_slices_while_a_first_pass_embeds(tmp_path, base_embedder, monkeypatch):
    monkeypatch.setattr(pending_module, "YIELD_S", 30.0)
    embedder = SlowEmbedder(base_embedder, 0.2)
    store = DocumentStore(str(tmp_path / "db"), embedder, STORE_SETTINGS)
    with pending_module.QUESTIONS.embedding():  # a first pass of other documents, under way
        ask(store, "What is the part number of the replacement impeller kit?")
        time.sleep(2.0)
        assert embedder.texts_embedded == 0  # the ingestion waits
    store.wait_inline()
    assert store.inline.holds(store.inline_name(DOCS), DOCS) and embedder.texts_embedded > 0
