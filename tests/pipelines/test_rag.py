import json

import pytest

from pipelines.base import ContextRequest
from pipelines.documents import LABEL_NAME_CHARS, Document
from pipelines.embedding import Embedder
from pipelines.long_context import LongContextPipeline
from pipelines.rag import RagPipeline, stitch
from pipelines.settings import ChunkingSettings, LongContextSettings, RagSettings
from pipelines.store import DocumentStore
from pipelines.tokens import count_tokens
from tests.support.pipelines import CountingEmbedder, distractor_documents, manual_document

SETTINGS = RagSettings(
    chunking=ChunkingSettings(chunk_tokens=48, chunk_overlap=8),
    top_k=4,
    expansion_neighbours=2,
    context_budget_tokens=600,
)
QUESTION = "What is the part number of the replacement impeller kit?"


@pytest.fixture(scope="module")
def embedder():
    return CountingEmbedder(Embedder())


@pytest.fixture(scope="module")
def store(tmp_path_factory, embedder):
    store = DocumentStore(str(tmp_path_factory.mktemp("rag") / "db"), embedder, SETTINGS)
    store.ingest("docs", [manual_document(), *distractor_documents()])
    return store


def test_retrieve_expands_neighbours_and_keeps_document_order(store):
    retrieval = RagPipeline(store, SETTINGS).retrieve("docs", QUESTION)
    assert retrieval.hits[0].chunk.doc_id == "manual.md" and "HP-IK-2231" in retrieval.hits[0].chunk.text
    top = retrieval.hits[0].chunk
    selected = [(c.chunk.doc_id, c.chunk.position) for c in retrieval.selected]
    # the best hit brings its neighbours on both sides (it gets the full expansion)
    assert ("manual.md", top.position - 1) in selected and ("manual.md", top.position + 1) in selected
    assert any(c.rank == 0 for c in retrieval.selected)  # neighbours are marked as such
    # document order within each document, documents grouped, best document first
    docs_in_order = list(dict.fromkeys(d for d, _ in selected))
    assert docs_in_order[0] == "manual.md"
    for doc in docs_in_order:
        positions = [p for d, p in selected if d == doc]
        assert positions == sorted(positions)
    assert len(docs_in_order) == len({d for d, _ in selected})
    # budget respected, exactly
    assert retrieval.context_tokens == count_tokens(retrieval.context_text) <= SETTINGS.context_budget_tokens
    assert retrieval.summary()["top_vector_score"] == pytest.approx(max(h.vector_score for h in retrieval.hits))


def test_passages_are_stitched_without_overlap_and_labelled(store):
    retrieval = RagPipeline(store, SETTINGS).retrieve("docs", QUESTION)
    passage = next(p for p in retrieval.passages if "HP-IK-2231" in p.text)
    assert len(passage.chunks) >= 3
    original = manual_document().text
    first, last = passage.chunks[0].chunk, passage.chunks[-1].chunk
    # the stitched text is the original span (chunk seams become a newline where chunks only touch)
    assert passage.text.replace("\n", "").replace(" ", "") == original[first.start : last.end].replace(
        "\n", ""
    ).replace(" ", "")
    assert passage.text.count("HP-IK-2231") == 1
    label = passage.label(1)
    assert label.startswith("[1] Document: Harbor Pump Operations Manual (manual.md)") and "4.2 Spare parts" in label


def test_a_long_title_or_id_is_cut_in_the_passage_label(store):
    # a passage's label repeats its document's title and id: a long title filled the rag budget with labels
    retrieval = RagPipeline(store, SETTINGS).retrieve("docs", QUESTION)
    passage = next(p for p in retrieval.passages if "HP-IK-2231" in p.text)
    passage.title = " ".join(f"title{i}" for i in range(2000))
    passage.doc_id = "doc-" + "x" * 500
    label = passage.label(1)
    assert label.startswith("[1] Document: title0 title1 ") and "… (doc-xxx" in label
    assert len(label) <= 2 * LABEL_NAME_CHARS + 40 + len("; ".join(passage.sections))


@pytest.mark.parametrize("budget", [64, 150, 300])
def test_selection_fits_small_budgets(store, budget):
    settings = SETTINGS.model_copy(update={"context_budget_tokens": budget})
    retrieval = RagPipeline(store, settings).retrieve("docs", QUESTION)
    assert retrieval.context_tokens <= budget
    assert retrieval.selected, "at least the best chunk fits"
    assert retrieval.selected[0].chunk.doc_id == "manual.md"


def test_prompt_has_instruction_passages_question_and_provenance(store):
    pipeline = RagPipeline(store, SETTINGS)
    messages = [
        {"role": "system", "content": "You are a marine engineer."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": QUESTION},
    ]
    prepared = pipeline.prepare(ContextRequest(QUESTION, messages, collection="docs"))
    assert prepared.messages[:3] == messages[:3]
    body = prepared.messages[-1]["content"]
    assert prepared.messages[-1]["role"] == "user"
    assert "reply with exactly one word: unanswerable" in body
    assert "HP-IK-2231" in body and body.endswith(f"Question: {QUESTION}")
    assert prepared.prompt_tokens == sum(count_tokens(m["content"]) + 4 for m in prepared.messages)
    prov = json.loads(json.dumps(prepared.provenance))
    assert prov["route"] == "rag" and prov["collection"] == "docs"
    manual = next(d for d in prov["documents"] if d["id"] == "manual.md")
    assert any("4.2 Spare parts" in s for s in manual["sections"]) and manual["chunks"] == sorted(manual["chunks"])
    assert prepared.retrieval and prepared.retrieval[0].rank == 1


def test_precomputed_retrieval_is_reused(store):
    pipeline = RagPipeline(store, SETTINGS)
    retrieval = pipeline.retrieve("docs", QUESTION)
    calls = []
    original = store.search
    store.search = lambda *a, **k: calls.append(a) or original(*a, **k)
    try:
        prepared = pipeline.prepare(
            ContextRequest(QUESTION, [{"role": "user", "content": QUESTION}], "docs"), retrieval
        )
    finally:
        del store.search
    assert calls == [] and prepared.retrieval == retrieval.hits


def test_inline_documents_are_embedded_once(store, embedder):
    pipeline = RagPipeline(store, SETTINGS)
    docs = [Document("memo", "The quarterly audit found that the warehouse in Lyon stores 412 pallets. " * 3)]
    request = ContextRequest("How many pallets are stored in Lyon?", [{"role": "user", "content": "?"}], documents=docs)
    first = pipeline.prepare(request)
    embedded = embedder.texts_embedded
    second = pipeline.prepare(
        ContextRequest(request.question, request.messages, documents=[Document("memo", docs[0].text)])
    )
    assert embedder.texts_embedded == embedded  # nothing: the documents are stored, the question remembered
    assert first.provenance["collection"] == second.provenance["collection"] and second.provenance["inline_documents"]
    assert "412 pallets" in second.messages[-1]["content"]


def test_request_without_context_is_an_error(store):
    with pytest.raises(ValueError):
        RagPipeline(store, SETTINGS).prepare(ContextRequest("q", []))


def test_long_pipeline_scores_units_with_stored_vectors(store, embedder):
    settings = LongContextSettings(
        window_tokens=1024, answer_reserve_tokens=256, unit_min_tokens=40, unit_max_tokens=300
    )
    pipeline = LongContextPipeline(settings, store=store)
    before = embedder.texts_embedded
    prepared = pipeline.prepare(ContextRequest(QUESTION, [{"role": "user", "content": QUESTION}], collection="docs"))
    assert embedder.texts_embedded == before  # no document text: units are scored from stored chunks
    assert prepared.provenance["all_fitted"] is False
    assert prepared.prompt_tokens <= 1024 - 256
    assert "HP-IK-2231" in prepared.messages[-1]["content"]


def test_stitch_handles_gaps_and_overlap():
    from pipelines.chunking import Chunk

    text = "abcdefghij"
    a, b, c = (
        Chunk("d", 0, text[0:5], None, 1, 0, 5),
        Chunk("d", 1, text[3:8], None, 1, 3, 8),
        Chunk("d", 2, text[8:10], None, 1, 8, 10),
    )
    assert stitch([a, b, c]) == "abcdefgh\nij"
