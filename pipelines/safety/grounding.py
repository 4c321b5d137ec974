"""Grounding check: is each sentence of an answer supported by the passages (units) that were sent to the model?

Pure: the caller passes ``embed(list[str]) -> np.ndarray`` returning L2-normalised rows (``Embedder.embed``); nothing
is loaded here. Per answer sentence (claim):

* semantic: the highest cosine between the claim and any passage window (passages are cut into windows of a few
  sentences so a long unit is not truncated by the encoder's 256-token limit and a claim is compared with the part
  that carries it);
* lexical: the share of the claim's content words (stop words dropped, crude plural folding) found in the passages;
* numbers: numbers in the claim (digits, decimals, 1,000-style groups, number words up to twenty) that appear in no
  passage. A number the passages never mention is strong evidence of an unsupported claim, so it caps the score.

    score = SEMANTIC_WEIGHT * semantic + LEXICAL_WEIGHT * lexical, then min(score, NUMBER_CAP) if a number is missing

Sentences with fewer than ``min_content_words`` content words ("Sure.", "In summary:") are not checked and count as
supported. Negation and swapped entities that keep the same words are NOT caught (the embedding barely moves).

    report = check(answer, passages, embed)           # GroundingReport
    report.unsupported                                # [SentenceScore] below the threshold
    drop(answer, report)                              # the answer without its unsupported sentences
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

EmbedFn = Callable[[list[str]], np.ndarray]

DEFAULT_THRESHOLD = 0.5  # see tests/benchmarks/bench_grounding.py for the calibration
SEMANTIC_WEIGHT = 0.6
LEXICAL_WEIGHT = 0.4
NUMBER_CAP = 0.3  # a claim with a number absent from every passage scores at most this
WINDOW_SENTENCES = 2  # passage windows: this many sentences, sliding by one
WINDOW_MAX_CHARS = 600

STOP_WORDS = frozenset(
    """
a about above after again against all also am an and any are aren't as at be because been before being below between
both but by can can't cannot could did didn't do does doesn't doing don't down during each either few for from further
had has have having he her here hers herself him himself his how however i if in into is isn't it it's its itself just
let's may me might more most must my myself no nor not of off on once only or other ought our ours ourselves out over
own same shall she should so some such than that that's the their theirs them themselves then there there's these
they this those through thus to too under until up upon us very was wasn't we were weren't what when where which while
who whom whose why will with within without would yes yet you your yours yourself yourselves according based said
says say stated states passage passages document documents text context answer question also well one's
""".split()
)

_NUMBER_WORDS = {
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "eleven": "11",
    "twelve": "12",
    "thirteen": "13",
    "fourteen": "14",
    "fifteen": "15",
    "sixteen": "16",
    "seventeen": "17",
    "eighteen": "18",
    "nineteen": "19",
    "twenty": "20",
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "sixty": "60",
    "seventy": "70",
    "eighty": "80",
    "ninety": "90",
    "hundred": "100",
    "thousand": "1000",
    "million": "1000000",
    "billion": "1000000000",
}
_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])|(?<![\w.])\.\d+\b")
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)
_ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b", re.IGNORECASE)
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)

# sentence boundaries: end punctuation followed by space and an upper-case letter/digit/quote, or a line break;
# common abbreviations and initials do not end a sentence
_ABBREVIATIONS = (
    "mr",
    "mrs",
    "ms",
    "dr",
    "prof",
    "sr",
    "jr",
    "st",
    "no",
    "vs",
    "etc",
    "inc",
    "ltd",
    "co",
    "corp",
    "e.g",
    "i.e",
    "cf",
    "fig",
    "sec",
    "art",
    "u.s",
    "u.k",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "approx",
    "dept",
    "est",
    "vol",
    "pp",
    "ch",
)
_SENTENCE_END = re.compile(r"([.!?。！？]+[\"'”’)\]]*)(\s+)|(\n\s*\n|\n(?=\s*(?:[-*•]|\d+[.)])\s))")
_LIST_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


@dataclass
class SentenceScore:
    index: int
    text: str
    start: int  # offsets into the answer
    end: int
    score: float
    semantic: float
    lexical: float
    missing_numbers: list[str] = field(default_factory=list)
    best_passage: int | None = None  # index into passages of the best window
    checked: bool = True  # False: too few content words to judge (counted as supported)
    supported: bool = True

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "score": round(self.score, 4),
            "semantic": round(self.semantic, 4),
            "lexical": round(self.lexical, 4),
            "missing_numbers": self.missing_numbers,
            "best_passage": self.best_passage,
            "checked": self.checked,
            "supported": self.supported,
        }


@dataclass
class GroundingReport:
    sentences: list[SentenceScore]
    threshold: float

    @property
    def unsupported(self) -> list[SentenceScore]:
        return [s for s in self.sentences if not s.supported]

    @property
    def checked(self) -> list[SentenceScore]:
        return [s for s in self.sentences if s.checked]

    @property
    def supported_fraction(self) -> float:
        checked = self.checked
        return 1.0 if not checked else sum(s.supported for s in checked) / len(checked)

    @property
    def min_score(self) -> float | None:
        checked = self.checked
        return min(s.score for s in checked) if checked else None

    def to_dict(self) -> dict:
        return {
            "threshold": self.threshold,
            "supported_fraction": round(self.supported_fraction, 4),
            "unsupported": [s.index for s in self.unsupported],
            "sentences": [s.to_dict() for s in self.sentences],
        }


# ----------------------------------------------------------------------------------------------------------------
# text helpers


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) spans of the sentences in ``text`` (whitespace trimmed; list items and paragraphs split)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for m in _SENTENCE_END.finditer(text):
        if m.group(1):
            before = text[pos : m.start(1)]
            if not any(c.isalpha() for c in before):  # "1." list marker, "..." alone
                continue
            last = re.search(r"([\w.]+)$", before)
            word = last.group(1).lower() if last else ""
            nxt = text[m.end() : m.end() + 1]
            if m.group(1).startswith(".") and (
                word.rstrip(".") in _ABBREVIATIONS
                or re.fullmatch(r"[a-z]", word)
                or re.fullmatch(r"\d+", word)
                and nxt[:1].isdigit()
            ):
                continue
            if nxt and nxt.islower():  # "e.g. the …", "approx. five" — no sentence starts lower-case
                continue
            cut = m.end(1)
        else:
            cut = m.start()
        _add_span(text, pos, cut, spans)
        pos = m.end()
    _add_span(text, pos, len(text), spans)
    return spans


def _add_span(text: str, a: int, b: int, spans: list[tuple[int, int]]) -> None:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    if b > a:
        spans.append((a, b))


_SUFFIXES = (
    "ational",
    "ations",
    "ation",
    "ingly",
    "ings",
    "ing",
    "ments",
    "ment",
    "ions",
    "ion",
    "ness",
    "ities",
    "ity",
    "ies",
    "ied",
    "ed",
    "ly",
    "ers",
    "er",
    "es",
    "s",
)


def _fold(word: str) -> str:
    """Lower case and a crude suffix strip (terminate / terminating / termination -> termin)."""
    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    for suffix in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= 4:
            w = w[: -len(suffix)]
            break
    if len(w) > 4 and w.endswith("e"):
        w = w[:-1]
    return w


def content_words(text: str) -> set[str]:
    return {_fold(w) for w in _WORD.findall(text) if w.lower() not in STOP_WORDS and not w.isdigit()} - {""}


def numbers(text: str) -> set[str]:
    """Numbers in ``text``, normalised: 1,000 -> 1000; 3.50 -> 3.5; 'three' -> 3; '21st' -> 21."""
    out: set[str] = set()
    text = _ORDINAL.sub(r"\1", text)
    for m in _NUMBER.finditer(text):
        raw = m.group(0).replace(",", "")
        if "." in raw:
            raw = raw.rstrip("0").rstrip(".") or "0"
            if raw.startswith("."):
                raw = "0" + raw
        else:
            raw = raw.lstrip("0") or "0"
        out.add(raw)
    for m in _NUMBER_WORD.finditer(text):
        out.add(_NUMBER_WORDS[m.group(1).lower()])
    return out


def passage_windows(
    passages: Sequence[str], sentences: int = WINDOW_SENTENCES, max_chars: int = WINDOW_MAX_CHARS
) -> tuple[list[str], list[int]]:
    """Windows of ``sentences`` consecutive sentences (sliding by one) and the passage index of each."""
    windows: list[str] = []
    owners: list[int] = []
    for i, passage in enumerate(passages):
        sents = [passage[a:b] for a, b in split_sentences(passage)]
        if not sents:
            continue
        if len(sents) <= sentences:
            windows.append(" ".join(sents)[: max_chars * 2])
            owners.append(i)
            continue
        for k in range(len(sents) - sentences + 1):
            windows.append(" ".join(sents[k : k + sentences])[: max_chars * 2])
            owners.append(i)
    return windows, owners


# ----------------------------------------------------------------------------------------------------------------
# the check


class GroundingChecker:
    def __init__(
        self,
        embed: EmbedFn,
        threshold: float = DEFAULT_THRESHOLD,
        semantic_weight: float = SEMANTIC_WEIGHT,
        lexical_weight: float = LEXICAL_WEIGHT,
        number_cap: float = NUMBER_CAP,
        min_content_words: int = 3,
        window_sentences: int = WINDOW_SENTENCES,
    ):
        self.embed = embed
        self.threshold = threshold
        self.semantic_weight = semantic_weight
        self.lexical_weight = lexical_weight
        self.number_cap = number_cap
        self.min_content_words = min_content_words
        self.window_sentences = window_sentences

    def check(self, answer: str, passages: Sequence[str]) -> GroundingReport:
        spans = split_sentences(answer or "")
        claims = [answer[a:b] for a, b in spans]
        passages = [p for p in passages if p and p.strip()]
        passage_words: set[str] = set()
        passage_numbers: set[str] = set()
        for p in passages:
            passage_words |= content_words(p)
            passage_numbers |= numbers(p)
        claim_words = [content_words(_LIST_BULLET.sub("", c)) for c in claims]
        to_check = [i for i, w in enumerate(claim_words) if len(w) >= self.min_content_words]

        semantic = np.zeros(len(claims), dtype=np.float32)
        best: list[int | None] = [None] * len(claims)
        windows, owners = passage_windows(passages, self.window_sentences)
        if to_check and windows:
            vectors = np.asarray(self.embed([claims[i] for i in to_check] + windows), dtype=np.float32)
            cv, wv = vectors[: len(to_check)], vectors[len(to_check) :]
            sims = cv @ wv.T
            arg = sims.argmax(axis=1)
            for row, i in enumerate(to_check):
                semantic[i] = float(sims[row, arg[row]])
                best[i] = owners[int(arg[row])]

        out: list[SentenceScore] = []
        for i, ((a, b), claim) in enumerate(zip(spans, claims)):
            words = claim_words[i]
            if i not in to_check:
                out.append(SentenceScore(i, claim, a, b, 1.0, 0.0, 0.0, [], None, checked=False, supported=True))
                continue
            lexical = len(words & passage_words) / len(words)
            missing = sorted(numbers(claim) - passage_numbers)
            score = self.semantic_weight * max(0.0, float(semantic[i])) + self.lexical_weight * lexical
            if missing:
                score = min(score, self.number_cap)
            out.append(
                SentenceScore(
                    i,
                    claim,
                    a,
                    b,
                    score,
                    float(semantic[i]),
                    lexical,
                    missing,
                    best[i],
                    checked=True,
                    supported=score >= self.threshold,
                )
            )
        return GroundingReport(out, self.threshold)


def check(
    answer: str, passages: Sequence[str], embed: EmbedFn, threshold: float = DEFAULT_THRESHOLD, **options
) -> GroundingReport:
    """Score every sentence of ``answer`` against ``passages``; see the module docstring."""
    return GroundingChecker(embed, threshold, **options).check(answer, passages)


def unsupported_sentences(
    answer: str, passages: Sequence[str], embed: EmbedFn, threshold: float = DEFAULT_THRESHOLD
) -> list[str]:
    return [s.text for s in check(answer, passages, embed, threshold).unsupported]


def drop(answer: str, report: GroundingReport) -> str:
    """``answer`` without the report's unsupported sentences (the text between kept sentences is preserved)."""
    removed = [(s.start, s.end) for s in report.unsupported]
    if not removed:
        return answer
    parts: list[str] = []
    pos = 0
    for a, b in removed:
        parts.append(answer[pos:a])
        pos = b
        # swallow the whitespace after a dropped sentence so no double spaces are left
        while pos < len(answer) and answer[pos] in " \t":
            pos += 1
    parts.append(answer[pos:])
    text = "".join(parts)
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()
