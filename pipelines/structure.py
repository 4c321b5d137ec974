"""Document structure: section headings, page breaks and cross-references.

Headings recognised (one per line): markdown (`## Title`), reStructuredText-style underlined titles,
numbered headings (`4.2 Title`, `4.2. Title`), keyword headings (`Article 12`, `Section 3`, `Appendix A`,
`Exhibit B`, `Schedule 3`, `Chapter II`), Chinese numbered headings (`第三条`, `第二章`) and short
all-capitals lines standing alone (`TERMINATION`). Page breaks are form feeds (\\f), which is how
pipelines.ingest joins PDF pages.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

_CN_NUM = "一二三四五六七八九十百千零〇两"

_MARKDOWN = re.compile(r"^\s{0,3}(#{1,6})\s+(?P<title>\S.*?)\s*#*\s*$")
_UNDERLINE = re.compile(r"^\s*([=\-~^*#+`'\"])\1{2,}\s*$")
_NUMBERED = re.compile(r"^\s{0,4}(?P<number>\d{1,3}(?:\.\d{1,3}){0,5})\.?\s+(?P<rest>\S.*?)\s*$")
_KEYWORD = re.compile(
    r"^\s{0,4}(?P<kw>article|section|chapter|part|appendix|exhibit|schedule|annex|clause)\s+"
    r"(?P<number>\d{1,3}(?:\.\d{1,3}){0,4}|(?-i:[IVXLC]{1,7})\b|(?-i:[A-Z])\b)\.?(?:\s*[:.\-–—]\s*|\s+|$)(?P<rest>.*?)\s*$",
    re.IGNORECASE,
)
_CHINESE = re.compile(rf"^\s{{0,4}}(?P<number>第[{_CN_NUM}\d]{{1,6}}[条章节编部分篇])\s*(?P<rest>.*?)\s*$")
_ALLCAPS = re.compile(r"^\s{0,4}(?P<title>[A-Z][A-Z0-9 ,&'’/()\-]{2,60})\s*$")

# A heading title is short; a longer line starting with a number is a list item or wrapped prose.
_MAX_TITLE_WORDS = 14
_MAX_HEADING_CHARS = 120


@dataclass(frozen=True)
class Section:
    title: str | None  # heading line as written (without markdown hashes); None for text before the first heading
    number: str | None  # "4.2", "12", "XII", "A", "第三条"; None for unnumbered headings
    start: int  # character offset of the heading (or of the text for the preamble)
    end: int  # exclusive offset where the next section starts
    page: int | None  # 1-based page of `start` when the text has form feeds, else None

    @property
    def label(self) -> str:
        return self.title or "(untitled)"


@dataclass(frozen=True)
class _Heading:
    start: int
    title: str
    number: str | None


def _lines(text: str) -> list[tuple[int, str]]:
    """(offset, line) pairs; form feeds also end a line so a page break never hides a heading."""
    out: list[tuple[int, str]] = []
    offset = 0
    for line in re.split(r"(?<=\n)|(?<=\f)", text):
        if line:
            out.append((offset, line.rstrip("\r\n\f")))
        offset += len(line)
    return out


def _is_blank(line: str | None) -> bool:
    return line is None or not line.strip()


def _short_title(rest: str) -> bool:
    words = rest.split()
    if not words or len(words) > _MAX_TITLE_WORDS or len(rest) > _MAX_HEADING_CHARS:
        return False
    # "4.2 shall mean ..." or "3. the buyer, ..." read as prose, not headings
    if rest[0].islower():
        return False
    return not rest.rstrip().endswith((",", ";", ":")) or len(words) <= 4


def _heading_at(lines: list[tuple[int, str]], i: int) -> _Heading | None:
    offset, line = lines[i]
    stripped = line.strip()
    if not stripped or len(stripped) > _MAX_HEADING_CHARS:
        return None
    prev_line = lines[i - 1][1] if i > 0 else None
    next_line = lines[i + 1][1] if i + 1 < len(lines) else None
    lead = offset + (len(line) - len(line.lstrip()))

    m = _MARKDOWN.match(line)
    if m:
        title = m.group("title")
        num = _NUMBERED.match(title) or _KEYWORD.match(title) or _CHINESE.match(title)
        return _Heading(lead, title, num.group("number") if num else None)

    underlined = next_line is not None and _UNDERLINE.match(next_line) is not None and not _UNDERLINE.match(line)
    if underlined:
        num = _NUMBERED.match(stripped)
        return _Heading(lead, stripped, num.group("number") if num else None)

    standalone = _is_blank(next_line) and (_is_blank(prev_line) or i == 0)
    m = _KEYWORD.match(line)
    if m and (standalone or _is_blank(next_line)) and (not m.group("rest") or _short_title(m.group("rest"))):
        return _Heading(lead, stripped, m.group("number"))
    m = _CHINESE.match(line)
    if m and len(stripped) <= 40:
        return _Heading(lead, stripped, m.group("number"))
    m = _NUMBERED.match(line)
    if m and _is_blank(next_line) and _short_title(m.group("rest")):
        return _Heading(lead, stripped, m.group("number"))
    m = _ALLCAPS.match(line)
    if m and standalone and sum(c.isalpha() for c in stripped) >= 4 and len(stripped.split()) <= 8:
        return _Heading(lead, stripped, None)
    return None


def page_starts(text: str) -> list[int]:
    """Offsets where pages 2, 3, ... begin (one past each form feed)."""
    return [m.end() for m in re.finditer("\f", text)]


def page_at(starts: list[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset) + 1


def split_sections(text: str) -> list[Section]:
    """Contiguous sections covering the whole text, in order; a preamble before the first heading is
    its own untitled section when it holds any text."""
    lines = _lines(text)
    headings = [h for i in range(len(lines)) if (h := _heading_at(lines, i)) is not None]
    breaks = page_starts(text)
    paged = bool(breaks)
    sections: list[Section] = []
    first = headings[0].start if headings else len(text)
    if text[:first].strip() or not headings:
        sections.append(Section(None, None, 0, first, 1 if paged else None))
    for h, nxt in zip(headings, headings[1:] + [None]):
        end = nxt.start if nxt else len(text)
        sections.append(Section(h.title, h.number, h.start, end, page_at(breaks, h.start) if paged else None))
    return sections


def heading_lines(text: str) -> list[tuple[int, int]]:
    """(start, end) of each heading line."""
    spans = []
    for s in split_sections(text):
        if s.title is not None:
            end = text.find("\n", s.start)
            spans.append((s.start, len(text) if end < 0 else end))
    return spans


# Cross-references: explicit pointers to another part of the document.
_REF_NUMBER = r"(?:\d{1,3}(?:\.\d{1,3}){0,5}(?:\s?\([a-z0-9]{1,4}\))*|(?-i:[IVXLC]{1,7})\b|(?-i:[A-Z])\b)"
_CROSS_REFERENCE = re.compile(
    "|".join(
        [
            rf"\b(?:sections?|articles?|clauses?|paragraphs?|chapters?|subsections?)\s+{_REF_NUMBER}",
            rf"§{{1,2}}\s?{_REF_NUMBER}",
            r"\b(?:appendix|appendices|exhibits?|schedules?|annex(?:es)?|attachments?)\s+(?:(?-i:[A-Z])\b|\d{1,3}(?:\.\d{1,3})?\b|(?-i:[IVXLC]{1,6})\b)",
            r"\bas (?:defined|described|set forth|provided|specified|stated|mentioned|referred to|discussed)"
            r"\s+(?:above|below|herein|hereinafter|hereof|hereunder|earlier|previously)\b",
            r"\bhereinafter\b",
            r"\b(?:see|cf\.)\s+(?:above|below)\b",
            rf"第[{_CN_NUM}\d]{{1,6}}[条章节款项](?:第[{_CN_NUM}\d]{{1,6}}[款项])*",
            r"(?:详见|参见|见)(?:附录|附件|附表)[A-Z0-9一二三四五六七八九十]*",
            r"(?:如上所述|如前所述|如下所述|前款所述|上文所述|下文所述)",
        ]
    ),
    re.IGNORECASE,
)


def find_cross_references(text: str) -> list[str]:
    """Every cross-reference in the text, in order ("Section 4.2", "Appendix A", "hereinafter", "第三条第二款").

    Headings are not references: a match that starts a heading line ("Article 12 Termination") is skipped.
    """
    headings = heading_lines(text)
    starts = [a for a, _ in headings]
    refs = []
    for m in _CROSS_REFERENCE.finditer(text):
        i = bisect.bisect_right(starts, m.start()) - 1
        if i >= 0 and m.start() < headings[i][1]:
            continue
        refs.append(re.sub(r"\s+", " ", m.group(0)))
    return refs
