from pathlib import Path

from pipelines.structure import find_cross_references, split_sections

MANUAL = (Path(__file__).parent / "fixtures" / "manual.md").read_text()


def test_markdown_numbered_sections_found_in_order():
    sections = split_sections(MANUAL)
    titles = [s.title for s in sections]
    assert titles[0] == "Harbor Pump Operations Manual"
    for expected in ["1. Introduction", "1.1 Scope", "1.2 Definitions", "4.2 Spare parts", "Appendix A", "Exhibit B"]:
        assert expected in titles
    numbers = {s.title: s.number for s in sections}
    assert numbers["4.2 Spare parts"] == "4.2"
    assert numbers["1. Introduction"] == "1"
    assert numbers["Appendix A"] == "A"
    # contiguous cover of the whole text
    assert sections[0].start == 0 and sections[-1].end == len(MANUAL)
    assert all(a.end == b.start for a, b in zip(sections, sections[1:]))
    assert MANUAL[sections[titles.index("4.2 Spare parts")].start :].startswith("### 4.2 Spare parts")
    assert all(s.page is None for s in sections)


def test_plain_text_headings_underlines_keywords_and_chinese():
    text = (
        "Preamble text.\n\n"
        "1.1. Scope\n==========\n\nBody one.\n\n"
        "ARTICLE 12 TERMINATION\n\nEither party may terminate.\n\n"
        "Section 3. Payment\n\nPay on time.\n\n"
        "3. Remove source modifications that are currently being applied when\n"
        "   building the package, which is a wrapped list item.\n\n"
        "第三条 保密义务\n双方应保密。\n\n"
        "CONFIDENTIALITY\n\nKeep secrets.\n"
    )
    sections = split_sections(text)
    titles = [s.title for s in sections]
    assert titles == [
        None,
        "1.1. Scope",
        "ARTICLE 12 TERMINATION",
        "Section 3. Payment",
        "第三条 保密义务",
        "CONFIDENTIALITY",
    ]
    assert [s.number for s in sections][1:5] == ["1.1", "12", "3", "第三条"]


def test_page_breaks_give_pages():
    text = "# One\n\nfirst page\f# Two\n\nsecond page\fstill two\f# Three\n\nfourth page"
    sections = split_sections(text)
    assert [(s.title, s.page) for s in sections] == [("One", 1), ("Two", 2), ("Three", 4)]


def test_cross_references_found_and_headings_not_counted():
    refs = find_cross_references(MANUAL)
    assert refs == [
        "Section 1.2",
        "Appendix A",
        "hereinafter",
        "Section 3.2",
        "as described above",
        "Section 1.2",
        "Exhibit B",
    ]


def test_cross_reference_forms():
    text = (
        "See Section 4.2 and section 10.1(a); under Article 12, Appendix A, Exhibit B and Schedule 3. "
        "Terms as defined above apply, hereinafter the Terms. 依照第三条第二款，详见附录A。如上所述，双方同意。"
    )
    assert find_cross_references(text) == [
        "Section 4.2",
        "section 10.1(a)",
        "Article 12",
        "Appendix A",
        "Exhibit B",
        "Schedule 3",
        "as defined above",
        "hereinafter",
        "第三条第二款",
        "详见附录A",
        "如上所述",
    ]


def test_cross_reference_negatives():
    text = (
        "The office schedules a meeting. This section of the road is closed. Part of the fee is due. "
        "An exhibit opened in the museum. The article was published in 2019."
    )
    assert find_cross_references(text) == []
