from pathlib import Path

import pytest

from pipelines.base import ContextRequest
from pipelines.documents import LABEL_NAME_CHARS, Document
from pipelines.long_context import (
    LongContextPipeline,
    UnitCache,
    bm25_scores,
    pack_long_context,
    prompt_tokens,
    render,
    split_units,
)
from pipelines.settings import LongContextSettings
from pipelines.tokens import count_tokens

MANUAL = (Path(__file__).parent / "fixtures" / "manual.md").read_text()


def filler_doc(i: int, paragraphs: int = 12) -> Document:
    body = "\n\n".join(
        f"## {j + 1}. Topic {i}-{j}\n\n"
        + " ".join(
            f"Paragraph {j} of report {i} discusses shipping schedule item {k} in general terms." for k in range(6)
        )
        for j in range(paragraphs)
    )
    return Document(f"report-{i}", body, title=f"Report {i}")


def test_units_follow_sections_and_respect_sizes():
    settings = LongContextSettings(unit_min_tokens=60, unit_max_tokens=200)
    units = split_units(Document("manual", MANUAL, title="Manual"), settings)
    assert [u.index for u in units] == list(range(len(units)))
    assert all(u.tokens <= 200 for u in units)
    assert all(u.tokens >= 60 for u in units[:-1])  # small sections were merged with their neighbours
    assert all(a.end <= b.start for a, b in zip(units, units[1:]))
    spare = next(u for u in units if "HP-IK-2231" in u.text)
    assert "4.2 Spare parts" in spare.sections
    assert spare.label().startswith("[Document: Manual (manual) | Section: ")


def test_a_long_title_id_or_heading_is_cut_in_every_label():
    # the label heads every unit: a 2,000-word title was sent once per unit (the long prompt 7x the documents' text,
    # past the request's reservation, which counts the text once)
    title = " ".join(f"title{i}" for i in range(2000))
    heading = "Heading " + " ".join(f"h{i}" for i in range(300))
    body = "\n\n".join(
        f"## {heading} {s}\n\n" + " ".join(f"Fact {s}-{w} is {w}." for w in range(40)) for s in range(12)
    )
    doc = Document("doc-" + "x" * 500, body, title=title)
    units = split_units(doc, LongContextSettings(unit_min_tokens=60, unit_max_tokens=400))
    assert len(units) >= 10
    assert all(len(u.label()) <= 4 * LABEL_NAME_CHARS + 40 for u in units)
    assert units[0].label().startswith("[Document: title0 title1 ") and "… (doc-xxx" in units[0].label()
    text_tokens = sum(u.tokens for u in units)
    assert count_tokens(render("What is fact 3-4?", units)) < 2 * text_tokens


def test_oversized_sections_are_split_and_pages_labelled():
    long_page = " ".join(f"Sentence {i} about the engine room." for i in range(200))
    text = "# Engines\n\n" + long_page + "\f# Hull\n\nThe hull is steel.\fPage three text about paint."
    settings = LongContextSettings(unit_min_tokens=1, unit_max_tokens=300)
    units = split_units(Document("ship", text), settings)
    assert len(units) >= 5
    assert all(u.tokens <= 300 for u in units)
    hull = next(u for u in units if "hull is steel" in u.text)
    assert hull.page == 2 and hull.sections == ("Hull",)
    paint = next(u for u in units if "paint" in u.text)
    assert paint.page == 3
    assert "Page: 3" in paint.label()


def test_everything_sent_when_it_fits():
    docs = [Document("manual", MANUAL, title="Manual")]
    packed = pack_long_context("What is the impeller part number?", docs, LongContextSettings(), 100_000)
    assert packed.all_fitted and len(packed.units) == packed.total_units
    assert packed.tokens == count_tokens(packed.text)
    assert "HP-IK-2231" in packed.text and packed.text.endswith("Question: What is the impeller part number?")


@pytest.mark.parametrize("placement", ["reading", "edges"])
@pytest.mark.parametrize("budget", [300, 700, 1500, 4000])
def test_packing_never_exceeds_budget(placement, budget):
    docs = [Document("manual", MANUAL, title="Manual")] + [filler_doc(i) for i in range(4)]
    settings = LongContextSettings(unit_min_tokens=50, unit_max_tokens=400, placement=placement)
    question = "What is the part number of the replacement impeller kit?"
    packed = pack_long_context(question, docs, settings, budget)
    assert packed.tokens == count_tokens(packed.text) <= budget
    assert not packed.all_fitted
    assert packed.units, "something must be sent"
    # the relevant unit wins the coarse selection
    assert "HP-IK-2231" in packed.text


def test_edges_placement_puts_best_units_first_and_last():
    docs = [Document("manual", MANUAL, title="Manual")] + [filler_doc(i, 4) for i in range(3)]
    settings = LongContextSettings(unit_min_tokens=1, unit_max_tokens=400, placement="edges")
    question = "impeller seal overheats dry pump part number"
    packed = pack_long_context(question, docs, settings, 100_000)
    ranked = sorted(packed.scores, reverse=True)
    assert packed.scores[0] == ranked[0] and packed.scores[-1] == ranked[1]
    middle = packed.scores[len(packed.scores) // 2]
    assert middle <= ranked[2]
    reading = pack_long_context(question, docs, settings.model_copy(update={"placement": "reading"}), 100_000)
    assert [(u.doc_id, u.index) for u in reading.units] == sorted(
        ((u.doc_id, u.index) for u in reading.units), key=lambda k: ([d.id for d in docs].index(k[0]), k[1])
    )


def test_reading_order_kept_after_selection():
    docs = [filler_doc(i) for i in range(3)] + [Document("manual", MANUAL)]
    settings = LongContextSettings(unit_min_tokens=50, unit_max_tokens=300)
    packed = pack_long_context("Where is the fuse placed and which dealers sell parts?", docs, settings, 900)
    keys = [(u.doc_id, u.index) for u in packed.units]
    order = {d.id: i for i, d in enumerate(docs)}
    assert keys == sorted(keys, key=lambda k: (order[k[0]], k[1]))


def test_budget_too_small_for_the_question_is_an_error():
    with pytest.raises(ValueError):
        pack_long_context("x " * 200, [Document("m", MANUAL)], LongContextSettings(), 50)


def test_bm25_prefers_matching_unit():
    settings = LongContextSettings(unit_min_tokens=1, unit_max_tokens=400)
    units = split_units(Document("manual", MANUAL), settings)
    scores = bm25_scores("dealers North Marine Supply", units)
    assert "Dealers:" in units[scores.index(max(scores))].text


def test_pipeline_budget_and_provenance_without_embedder():
    docs = [Document("manual", MANUAL, title="Manual")] + [filler_doc(i) for i in range(6)]
    settings = LongContextSettings(
        window_tokens=2048, answer_reserve_tokens=512, unit_min_tokens=50, unit_max_tokens=400
    )
    pipeline = LongContextPipeline(settings, window_tokens=999_999)
    assert pipeline.window_tokens == 2048
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "[pasted documents] " + "filler " * 3000 + "\n\nWhat fuse protects the pump?"},
    ]
    prepared = pipeline.prepare(ContextRequest("What fuse protects the pump?", messages, documents=docs))
    assert prepared.prompt_tokens <= 2048 - 512
    assert prepared.messages[0] == {"role": "system", "content": "Be brief."}
    assert len(prepared.messages) == 2  # the pasted turn is replaced, not carried
    assert "15 ampere fuse" in prepared.messages[-1]["content"]
    prov = prepared.provenance
    assert prov["route"] == "long" and prov["all_fitted"] is False
    assert prov["units_sent"] == len(prov["units"]) < prov["units_total"]
    manual = next(d for d in prov["documents"] if d["id"] == "manual")
    assert any("2.2 Wiring" in s for s in manual["sections"])
    import json

    json.dumps(prov)


def test_render_contains_instructions_and_question():
    text = render("Why?", [])
    assert text.startswith("Answer the question") and text.endswith("Question: Why?")


@pytest.mark.parametrize(
    "question", ["Why?", "  leading spaces and a trailing newline\n", "第三条第二款是什么？", "[x]."]
)
def test_prompt_tokens_is_the_exact_count_of_the_rendered_prompt(question):
    # units ending in punctuation, spaces, newlines and CJK: the seams tiktoken could merge across
    endings = ["end.", "end.  ", "end\n", "end:\n  \n", "结束。", "x)", "42", "tab\t"]
    docs = [
        Document(f"d{i}", f"# Part {i}\n\nBody of part {i} {ending}", title=f"T{i}") for i, ending in enumerate(endings)
    ]
    docs.append(Document("manual", MANUAL, title="Manual"))
    settings = LongContextSettings(unit_min_tokens=1, unit_max_tokens=120)
    units = [u for d in docs for u in split_units(d, settings)]
    costs = [count_tokens(f"{u.label()}\n{u.text}\n\n") for u in units]
    for n in (0, 1, 2, len(units)):
        assert prompt_tokens(question, costs[:n]) == count_tokens(render(question, units[:n]))
    assert prompt_tokens(question, costs[::-1]) == count_tokens(render(question, units[::-1]))


def test_unit_cache_keeps_units_by_content():
    cache = UnitCache(size=3)
    settings = LongContextSettings(unit_min_tokens=50, unit_max_tokens=300)
    doc = Document("manual", MANUAL, title="Manual")
    first = cache.get(doc, settings)
    assert cache.get(Document("manual", MANUAL, title="Manual"), settings) is first
    assert cache.get(Document("manual", MANUAL + "\n\nMore.", title="Manual"), settings) is not first
    assert cache.get(Document("manual", MANUAL, title="Other"), settings) is not first  # labels carry the title
    assert (
        cache.get(Document("manual", MANUAL, title="Manual", metadata={"selfroute_key": "k2"}), settings) is not first
    )
    assert cache.get(doc, settings) is not first  # dropped: the cache holds three
    assert [u.tokens for u in first.units] == [u.tokens for u in split_units(doc, settings)]
