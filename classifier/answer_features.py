"""Answer-aware verifier features: what the cheap route's answer says about its own quality.

After the cheap (RAG) route has answered, a verifier (classifier.verifier) scores P(the cheap answer
is good enough); below a threshold the gateway escalates to the long route (FrugalGPT's scorer,
AutoMix's self-verification, without an extra LLM call). These are its inputs, computed from plain
values with no I/O and no gateway or pipelines imports, so training, replay and the gateway share them:

- refusal and hedge cues (English and Chinese) in the answer;
- answer shape: length, numbers, length against the question;
- multiple choice: does the answer name exactly one valid option, does its text match that option,
  and how well do the retrieved passages support the chosen option compared with the others;
- grounding: the share of the answer's content words, numbers and word pairs found in the passages
  the cheap model saw, and in the whole document (terms in the document but not in the passages
  are evidence the answer needed more of the document);
- portable signals (PORTABLE_SIGNALS): a question about order, counts or the whole document, and the question's
  terms in the document and in the passages, read with the refusal;
- optional extras, NaN when absent: token log-probabilities of the answer, the pre-route P(cheap).

Every value is a float; missing values are NaN (the model's imputer fills them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from classifier.stopwords import ANSWER_STOPWORDS

MISSING = float("nan")

# -- refusals and hedges --------------------------------------------------------------------------
# A refusal is what the reply opens with (see pipelines.unanswerable): an answer that says deep inside
# that one detail "is not mentioned" still answers. REFUSAL_HEAD_CHARS bounds the opening.
REFUSAL_HEAD_CHARS = 240
REFUSAL_PATTERNS = [
    r"^\W*unanswerable\W*$",
    r"\bunanswerable\b",
    r"\b(?:i|we) (?:cannot|can ?not|can't|am unable to|are unable to|was unable to|could not|couldn't) "
    r"(?:answer|determine|find|tell|provide|locate|identify)",
    r"\b(?:i'm|i am) (?:sorry|afraid)\b",
    r"\bcannot be (?:answered|determined|found|inferred|identified) (?:from|based on|in|with|using) (?:the )?"
    r"(?:given |provided |available )?(?:passages?|context|documents?|text|information|excerpts?)",
    r"\b(?:it is|it's) (?:not possible|impossible) to (?:determine|answer|say|tell|know)",
    r"\b(?:not|no) (?:explicitly |specifically |directly )?(?:mentioned|provided|stated|found|specified|given|"
    r"included|addressed|discussed) in the (?:given |provided |available )?"
    r"(?:passages?|context|documents?|text|information|excerpts?|transcript|contract)",
    r"\b(?:passages?|context|documents?|text|transcript|information|excerpts?) (?:does|do) not (?:explicitly |"
    r"specifically |directly )?(?:contain|mention|provide|say|specify|include|state|give|indicate|address)",
    r"^\W*(?:based on|according to|from) the (?:given |provided |available )?(?:passages?|context|documents?|"
    r"text|information|excerpts?),? there (?:is|are) (?:no|not enough)",
    r"^\W*there (?:is|are) (?:no|not enough) (?:specific |direct |explicit |clear )?(?:information|mention|details?|"
    r"indication|evidence|reference)",
    r"\bnot enough information\b",
    r"^\W*it is not (?:specified|mentioned|stated|provided|given|clear) (?:in|from) the",
    r"\binsufficient (?:information|context|evidence)",
    # Chinese: "cannot answer", "cannot determine", "the text does not mention", "no relevant information"
    r"无法回答",
    r"无法(?:确定|判断|得知|找到|回答)",
    r"不能(?:确定|回答|判断)",
    r"(?:文中|文章|上下文|文档|材料|段落|原文)(?:中)?(?:没有|未|并未|并没有)(?:提及|提到|给出|说明|涉及)",
    r"没有(?:相关|足够)(?:的)?(?:信息|内容)",
    r"(?:信息|内容)不足",
]
# Hedges: the answer commits, but with doubt (AutoMix's "unsure" verdicts). Matched anywhere.
HEDGE_PATTERNS = [
    r"\b(?:may|might|could) (?:be|have|refer|suggest|indicate)\b",
    r"\b(?:possibly|perhaps|probably|presumably|apparently|likely|unlikely)\b",
    r"\b(?:it )?(?:seems|appears) (?:that|to)\b",
    r"\b(?:not (?:explicitly|directly|specifically|clearly)|unclear|not clear|uncertain|ambiguous)\b",
    r"\bdoes not (?:explicitly|directly|specifically)\b",
    r"\b(?:however|but) (?:the|it|there)\b",
    r"\bimplied\b|\bimplies\b|\binferred?\b",
    r"可能|似乎|也许|大概|不确定|不清楚|好像",
]
_REFUSAL = [re.compile(p, re.IGNORECASE) for p in REFUSAL_PATTERNS]
_HEDGE = [re.compile(p, re.IGNORECASE) for p in HEDGE_PATTERNS]


def _squash(text: str) -> str:
    return " ".join(text.split())


def is_refusal(answer: str | None, head_chars: int = REFUSAL_HEAD_CHARS) -> bool:
    """True when the answer declares that the passages lack the answer (English or Chinese cues in its
    opening), or is empty. The gateway can use it to escalate, or to let a refusal stand."""
    if answer is None or not answer.strip():
        return True
    head = _squash(answer)[:head_chars]
    return any(p.search(head) for p in _REFUSAL)


def refusal_anywhere(answer: str | None) -> bool:
    """A refusal cue anywhere in the answer (partial refusals: "X; the text does not mention Y")."""
    if not answer:
        return False
    text = _squash(answer)
    return any(p.search(text) for p in _REFUSAL)


def hedge_count(answer: str | None) -> int:
    """Number of hedge cues (English and Chinese) in the answer."""
    if not answer:
        return 0
    text = _squash(answer)
    return sum(len(p.findall(text)) for p in _HEDGE)


# -- tokens -----------------------------------------------------------------------------------------
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:%|\b)")


def _tokens(text: str) -> list[str]:
    """Lower-cased words; a run of CJK characters becomes its character bigrams (Chinese has no spaces)."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        if _CJK.search(w):
            chars = [c for c in w if _CJK.match(c)]
            out.extend(a + b for a, b in zip(chars, chars[1:])) if len(chars) > 1 else out.extend(chars)
        else:
            out.append(w)
    return out


def content_terms(text: str) -> list[str]:
    """Meaningful words in order (stopwords, one-letter words and bare numbers dropped)."""
    return [w for w in _tokens(text) if (len(w) > 1 or _CJK.match(w)) and w not in ANSWER_STOPWORDS and not w.isdigit()]


def numbers(text: str) -> set[str]:
    """Numbers as written, separators dropped ("1,200" -> "1200")."""
    return {n.replace(",", "").rstrip("%").rstrip(".") for n in _NUMBER.findall(text)}


def _bigrams(terms: list[str]) -> set[tuple[str, str]]:
    return set(zip(terms, terms[1:]))


def _share(items: set, pool: set) -> float:
    return len(items & pool) / len(items) if items else MISSING


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


# -- multiple choice ----------------------------------------------------------------------------------
# Options written as "A. ...", "(A) ...", "A) ..." at the start of a line (as classifier.features).
_OPTION_LINE = re.compile(r"^\s*(?:\(([A-Ha-h])\)|([A-H])[.)])\s+(.*)$", re.MULTILINE)
# A letter the answer names: "B", "(B)", "B.", "answer is B", "option C" (capital letters only).
_ANSWER_LETTER = re.compile(r"(?:^|[\s(\[\"'])\(?([A-H])(?:[).:\]]|\s*$|\s+(?=[A-Z\-–]))")


def parse_options(query: str) -> dict[str, str]:
    """{letter: option text} of a multiple-choice query (empty when fewer than two options)."""
    options: dict[str, str] = {}
    for m in _OPTION_LINE.finditer(query):
        letter = (m.group(1) or m.group(2)).upper()
        options.setdefault(letter, m.group(3).strip())
    return options if len(options) >= 2 else {}


def _stem(query: str) -> str:
    m = _OPTION_LINE.search(query)
    return query[: m.start()] if m and parse_options(query) else query


def answer_letters(answer: str, options: dict[str, str]) -> list[str]:
    """Valid option letters the answer names, in order of first mention."""
    seen: list[str] = []
    for m in _ANSWER_LETTER.finditer(answer):
        letter = m.group(1)
        if letter in options and letter not in seen:
            seen.append(letter)
    return seen


def _option_support(option_terms: set[str], passage_terms: set[str]) -> float:
    return len(option_terms & passage_terms) / len(option_terms) if option_terms else 0.0


# -- the feature set ------------------------------------------------------------------------------------
# signals measured to keep their direction on both corpora and every model family (BENCHMARKS.md section 4,
# "What transfers, round five"): questions retrieval cannot answer from a few passages, and the question's terms the
# document has against those the passages sent have, read with the refusal; kept out of
# classifier.verifier.TRANSFER_FEATURE_NAMES and read by its PORTABLE_FEATURE_NAMES
PORTABLE_SIGNALS = (
    "query_global_cue",
    "query_doc_absent_terms",
    "query_retrieved_share",
    "answer_x_query_absent",
    "answer_x_bigrams_absent",
    "answer_x_unretrieved",
    "refusal_x_unretrieved",
)
ANSWER_FEATURE_NAMES: list[str] = [
    # refusals and hedges
    "ans_missing",
    "ans_refusal",
    "ans_refusal_anywhere",
    "ans_hedges",
    # shape
    "ans_words",
    "ans_log_chars",
    "ans_numbers",
    "ans_query_len_ratio",
    "ans_query_overlap",
    # multiple choice
    "mc_question",
    "mc_letter_valid",
    "mc_letters_named",
    "mc_option_text_match",
    "mc_letter_text_agree",
    "mc_chosen_support",
    "mc_support_margin",
    "mc_chosen_is_best_supported",
    # grounding in the passages the cheap model saw and in the whole document
    "ans_support_passages",
    "ans_support_document",
    "ans_support_gap",
    "ans_unsupported_terms",
    "ans_number_support_passages",
    "ans_number_support_document",
    "ans_bigram_support_passages",
    "ans_bigram_support_document",
    "query_support_passages",
    "query_support_document",
    "passage_share_of_document",
    # optional extras
    "ans_logprob_mean",
    "ans_logprob_min",
    "pre_route_probability",
    # signals meant to hold on any corpus and model (BENCHMARKS.md section 4a): the question's names and
    # phrases in the document at all (a refusal is right when they are not there) ...
    "query_names_absent_document",
    "query_bigrams_absent_document",
    # ... the retrieval pass that chose the passages sent (classifier.features' retrieval signals) ...
    "ret_top_score",
    "ret_top_margin",
    "ret_score_spread",
    "ret_term_coverage",
    "ret_hit_spread",
    # ... and the answer's support in the passages in embedding space (per answer sentence, as the grounding
    # check scores it), NaN when no embedding model is at hand
    "ans_passage_similarity",
    "ans_sentence_support_mean",
    "ans_sentence_support_min",
    "query_passage_similarity",
    *PORTABLE_SIGNALS,
]
# classifier.features' retrieval signals copied into the verifier's inputs under these names
RETRIEVAL_INPUTS = {
    "ret_top_score": "top_score",
    "ret_top_margin": "top_margin",
    "ret_score_spread": "score_spread",
    "ret_term_coverage": "term_coverage",
}
SUPPORT_FEATURES = (
    "ans_passage_similarity",
    "ans_sentence_support_mean",
    "ans_sentence_support_min",
    "query_passage_similarity",
)
# Cues of a question about the document as a whole or its order (which topic came first, how many times, the main
# theme, how two parts compare): top-k passages cannot show order, counts or wholes, so a cheap answer to such a
# question is more often worse than the long one, on every corpus and model measured.
GLOBAL_CUE_PATTERN = re.compile(
    r"\b(?:first|second|third|fourth|fifth|last|final|beginning|end|earlier|later|previous|next|order|sequence|"
    r"before|after|how many|number of|count|times|every|all|each|overall|whole|entire|throughout|main|theme|"
    r"summar\w*|topic|compare|comparison|differ\w*|both|between)\b",
    re.IGNORECASE,
)


def _mc_features(query: str, answer: str, answer_terms: set[str], passage_terms: set[str]) -> dict[str, float]:
    options = parse_options(query)
    if not options:
        return {
            "mc_question": 0.0,
            "mc_letter_valid": MISSING,
            "mc_letters_named": MISSING,
            "mc_option_text_match": MISSING,
            "mc_letter_text_agree": MISSING,
            "mc_chosen_support": MISSING,
            "mc_support_margin": MISSING,
            "mc_chosen_is_best_supported": MISSING,
        }
    letters = answer_letters(answer, options)
    option_terms = {k: set(content_terms(v)) for k, v in options.items()}
    match = {k: _jaccard(answer_terms, t) for k, t in option_terms.items()}
    best_text = max(match, key=lambda k: (match[k], k == (letters[0] if letters else None)))
    chosen = letters[0] if letters else (best_text if match[best_text] > 0 else None)
    support = {k: _option_support(t, passage_terms) for k, t in option_terms.items()}
    out = {
        "mc_question": 1.0,
        "mc_letter_valid": float(len(letters) == 1),
        "mc_letters_named": float(len(letters)),
        "mc_option_text_match": float(match[best_text]),
        # the named letter is the option whose text the answer repeats (when it repeats any text)
        "mc_letter_text_agree": (float(best_text == letters[0]) if letters and match[best_text] > 0 else MISSING),
        "mc_chosen_support": MISSING,
        "mc_support_margin": MISSING,
        "mc_chosen_is_best_supported": MISSING,
    }
    if chosen is not None:
        others = [v for k, v in support.items() if k != chosen]
        out["mc_chosen_support"] = support[chosen]
        out["mc_support_margin"] = support[chosen] - (max(others) if others else 0.0)
        out["mc_chosen_is_best_supported"] = float(support[chosen] >= max(support.values()))
    return out


_TITLE = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|Prof|Sr|Jr|Mt|No|vs)\.$")
_NAME = re.compile(r"(?<![\w])(?:[A-Z][\w'’-]*[a-z0-9][\w'’-]*|[A-Z]{2,}|\d[\d,.]*)")


def query_names(stem: str) -> set[str]:
    """The question's names and numbers: capitalised words that do not open the question (or a sentence),
    acronyms and numbers, lower-cased and cut into content terms ("Miss Winslow" -> {"miss", "winslow"})."""
    out: set[str] = set()
    for m in _NAME.finditer(stem):
        before = stem[: m.start()].rstrip()
        opens = not before or before[-1] in "?!:\"'“(" or (before[-1] == "." and not _TITLE.search(before))
        if opens:
            continue  # the opening word of a sentence is capitalised anyway
        token = m.group(0)
        out.update(numbers(token) if token[0].isdigit() else content_terms(token))
    return out


def _logprob_features(logprobs: list[float] | None) -> tuple[float, float]:
    values = [float(v) for v in (logprobs or []) if v is not None and math.isfinite(float(v))]
    if not values:
        return MISSING, MISSING
    return sum(values) / len(values), min(values)


def answer_features(
    query: str,
    answer: str | None,
    passages: list[str],
    document_text: str | None,
    logprobs: list[float] | None = None,
    pre_route_probability: float | None = None,
    *,
    retrieval: dict[str, float] | None = None,
    support: dict[str, float] | None = None,
    document_terms_set: set[str] | None = None,
    document_bigrams: set[tuple[str, str]] | None = None,
    document_numbers: set[str] | None = None,
) -> dict[str, float]:
    """Every feature in ANSWER_FEATURE_NAMES, in that order.

    query: the user's question as the cheap model saw it (multiple-choice options included).
    answer: the cheap route's reply text; None or empty counts as a refusal.
    passages: the retrieved passage texts placed in the cheap prompt (after budgeting), best or document order.
    document_text: the whole attached context (all documents joined); None when unavailable, and the
        document-side features are NaN. For speed the caller may pass precomputed sets instead
        (document_terms_set, document_bigrams, document_numbers: see document_index()).
    logprobs: the answer's token log-probabilities when the upstream returned them, else None (NaN).
    pre_route_probability: the pre-route classifier's P(cheap) for this request, else None (NaN).
    retrieval: the retrieval pass's signals (classifier.features' top_score, top_margin, score_spread,
        term_coverage, and `hit_spread`: how far apart in the document the hits lie, 0..1); None: NaN.
    support: the embedding-side values of SUPPORT_FEATURES (gateway.routing.answer_support); None: NaN.
    """
    answer = answer or ""
    text = _squash(answer)
    stem = _stem(query)
    a_terms_list = content_terms(text)
    a_terms = set(a_terms_list)
    a_bigrams = _bigrams(a_terms_list)
    a_numbers = numbers(text)
    q_terms = set(content_terms(stem))
    p_text = "\n".join(passages)
    p_terms_list = content_terms(p_text)
    p_terms = set(p_terms_list)
    p_bigrams = _bigrams(p_terms_list)
    p_numbers = numbers(p_text)

    if document_terms_set is None and document_text is not None:
        index = document_index(document_text)
        document_terms_set, document_bigrams, document_numbers = index
    has_doc = document_terms_set is not None
    # Typed views of the document sets; only read where has_doc holds.
    doc_terms: set[str] = document_terms_set or set()
    doc_bigrams: set[tuple[str, str]] = document_bigrams or set()
    doc_numbers: set[str] = document_numbers or set()

    refusal = is_refusal(answer)
    out: dict[str, float] = {
        "ans_missing": float(not text),
        "ans_refusal": float(refusal),
        "ans_refusal_anywhere": float(refusal_anywhere(answer)),
        "ans_hedges": float(hedge_count(answer)),
        "ans_words": float(len(_tokens(text))),
        "ans_log_chars": math.log1p(len(text)),
        "ans_numbers": float(len(a_numbers)),
        "ans_query_len_ratio": len(_tokens(text)) / max(len(_tokens(stem)), 1),
        # the answer restating the question rather than adding to it
        "ans_query_overlap": _share(a_terms, q_terms),
    }
    # grounding: answer terms that are not the question's own words carry the answer
    new_terms = a_terms - q_terms
    out["ans_support_passages"] = _share(new_terms, p_terms)
    out["ans_support_document"] = _share(new_terms, doc_terms) if has_doc else MISSING
    out["ans_support_gap"] = (
        out["ans_support_document"] - out["ans_support_passages"] if has_doc and new_terms else MISSING
    )
    out["ans_unsupported_terms"] = (
        float(len(new_terms - p_terms - (document_terms_set or set()))) if a_terms else MISSING
    )
    out["ans_number_support_passages"] = _share(a_numbers, p_numbers)
    out["ans_number_support_document"] = _share(a_numbers, doc_numbers) if has_doc else MISSING
    out["ans_bigram_support_passages"] = _share(a_bigrams, p_bigrams)
    out["ans_bigram_support_document"] = _share(a_bigrams, doc_bigrams) if has_doc else MISSING
    out["query_support_passages"] = _share(q_terms, p_terms)
    out["query_support_document"] = _share(q_terms, doc_terms) if has_doc else MISSING
    out["passage_share_of_document"] = (
        len(p_terms & document_terms_set) / len(document_terms_set) if has_doc and document_terms_set else MISSING
    )
    out.update(_mc_features(query, text, a_terms, p_terms))
    names = query_names(stem)
    out["query_names_absent_document"] = 1.0 - _share(names, doc_terms | doc_numbers) if has_doc and names else MISSING
    q_bigrams = _bigrams(content_terms(stem))
    out["query_bigrams_absent_document"] = (
        1.0 - _share(q_bigrams, document_bigrams) if has_doc and q_bigrams and document_bigrams is not None else MISSING
    )
    out.update(_portable_signals(stem, refusal, q_terms, p_terms, doc_terms if has_doc else None, out))
    retrieval = retrieval or {}
    for name, key in RETRIEVAL_INPUTS.items():
        out[name] = _value(retrieval.get(key))
    out["ret_hit_spread"] = _value(retrieval.get("hit_spread"))
    for name in SUPPORT_FEATURES:
        out[name] = _value((support or {}).get(name))
    out["ans_logprob_mean"], out["ans_logprob_min"] = _logprob_features(logprobs)
    out["pre_route_probability"] = MISSING if pre_route_probability is None else float(pre_route_probability)
    return {name: float(out[name]) for name in ANSWER_FEATURE_NAMES}


def _portable_signals(
    stem: str,
    refusal: bool,
    q_terms: set[str],
    p_terms: set[str],
    doc_terms: set[str] | None,
    computed: dict[str, float],
) -> dict[str, float]:
    """PORTABLE_SIGNALS: a question the passages cannot answer (GLOBAL_CUE_PATTERN), and the question's terms in the
    document and in the passages sent, read with the refusal. An answer (not a refusal) to a question whose terms are
    not in the document, or are in it but not in the passages, is more often worse than the long one; a refusal is
    wrong when the document has the terms the passages lack. A question without content terms counts as absent from
    the document; one with none of its terms in the document as wholly retrieved (there was nothing to find)."""
    out = {"query_global_cue": float(len(GLOBAL_CUE_PATTERN.findall(stem)))}
    if doc_terms is None:
        return out | {n: MISSING for n in PORTABLE_SIGNALS if n != "query_global_cue"}
    in_doc = q_terms & doc_terms
    retrieved = len(in_doc & p_terms) / len(in_doc) if in_doc else MISSING
    unretrieved = 0.0 if math.isnan(retrieved) else 1.0 - retrieved
    support = computed["query_support_document"]
    absent = 1.0 - (0.0 if math.isnan(support) else support)
    answered = 0.0 if refusal else 1.0
    return out | {
        "query_doc_absent_terms": float(len(q_terms - doc_terms)),
        "query_retrieved_share": retrieved,
        "answer_x_query_absent": answered * absent,
        "answer_x_bigrams_absent": answered * computed["query_bigrams_absent_document"],
        "answer_x_unretrieved": answered * unretrieved,
        "refusal_x_unretrieved": (1.0 - answered) * unretrieved,
    }


def _value(value: float | None) -> float:
    return MISSING if value is None else float(value)


def document_index(document_text: str) -> tuple[set[str], set[tuple[str, str]], set[str]]:
    """(content terms, content-term bigrams, numbers) of a document: compute once per document and pass
    to answer_features as document_terms_set / document_bigrams / document_numbers."""
    terms = content_terms(document_text)
    return set(terms), _bigrams(terms), numbers(document_text)


def answer_feature_vector(features: dict[str, float], names: Iterable[str] = ANSWER_FEATURE_NAMES) -> list[float]:
    """Features as a row in `names` order (missing names become NaN)."""
    return [float(features.get(name, MISSING)) for name in names]
