from pathlib import Path

import pytest

from pipelines.chunking import chunk_document, pack_spans, sentence_spans
from pipelines.documents import Document
from pipelines.settings import ChunkingSettings
from pipelines.structure import split_sections
from pipelines.tokens import count_tokens

MANUAL = (Path(__file__).parent / "fixtures" / "manual.md").read_text()


@pytest.mark.parametrize("size,overlap", [(48, 8), (64, 0), (200, 32)])
def test_chunks_respect_size_and_are_exact_slices(size, overlap):
    doc = Document("manual", MANUAL)
    chunks = chunk_document(doc, ChunkingSettings(chunk_tokens=size, chunk_overlap=overlap))
    assert [c.position for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert c.text == MANUAL[c.start : c.end]
        assert c.tokens == count_tokens(c.text) <= size
        assert c.doc_id == "manual"
    # every word of the document is in some chunk
    covered = set()
    for c in chunks:
        covered.update(range(c.start, c.end))
    assert all(i in covered for i, ch in enumerate(MANUAL) if not ch.isspace())


def test_chunks_do_not_cross_sections_except_merged_small_ones():
    doc = Document("manual", MANUAL)
    chunks = chunk_document(doc, ChunkingSettings(chunk_tokens=48, chunk_overlap=8))
    sections = split_sections(MANUAL)
    for c in chunks:
        inside = [s for s in sections if s.start < c.end and s.end > c.start]
        # a chunk spanning sections only does so because the earlier ones were too small to stand alone
        for s in inside[:-1]:
            assert count_tokens(MANUAL[s.start : s.end]) < 48 // 4 + 1
        assert c.section is not None and inside[-1].title in c.section
    spare = [c for c in chunks if "HP-IK-2231" in c.text]
    assert spare and spare[0].section.endswith("4.2 Spare parts")


def test_overlap_repeats_trailing_sentences():
    text = " ".join(f"Sentence number {i} says something about pumps." for i in range(40))
    chunks = chunk_document(Document("d", text), ChunkingSettings(chunk_tokens=40, chunk_overlap=12))
    assert len(chunks) > 3
    for a, b in zip(chunks, chunks[1:]):
        assert b.start < a.end  # overlapping
        assert b.start > a.start
    no_overlap = chunk_document(Document("d", text), ChunkingSettings(chunk_tokens=40, chunk_overlap=0))
    assert all(b.start >= a.end for a, b in zip(no_overlap, no_overlap[1:]))


def test_sentence_longer_than_a_chunk_is_cut_on_tokens():
    text = "word " * 500  # no sentence boundary at all
    chunks = chunk_document(Document("d", text.strip()), ChunkingSettings(chunk_tokens=64, chunk_overlap=0))
    assert len(chunks) >= 7
    assert all(c.tokens <= 64 for c in chunks)
    assert "".join(text.strip()[c.start : c.end] for c in chunks).replace(" ", "") == text.replace(" ", "")


def test_chinese_sentences():
    text = "第一条 总则\n\n" + "本合同由双方签订。" * 30 + "\n\n第二条 付款\n\n买方应在三十日内付款。"
    chunks = chunk_document(Document("cn", text), ChunkingSettings(chunk_tokens=40, chunk_overlap=0))
    assert all(c.tokens <= 40 for c in chunks)
    assert chunks[-1].section is not None and "第二条" in chunks[-1].section
    assert all(c.text.endswith("。") for c in chunks)


def test_sentence_spans_and_pack_spans():
    text = "One. Two!  Three?\n\nFour"
    assert [text[a:b] for a, b in sentence_spans(text, 0, len(text))] == ["One.", "Two!", "Three?", "Four"]
    assert pack_spans(text, 0, len(text), 1000) == [(0, len(text))]
