"""pipelines.safety.grounding with a tiny bag-of-words embed function (one slow test uses the real MiniLM)."""

import hashlib
import re

import numpy as np
import pytest

from pipelines.safety.grounding import (
    DEFAULT_THRESHOLD,
    GroundingChecker,
    check,
    drop,
    numbers,
    split_sentences,
    unsupported_sentences,
)

PASSAGES = [
    "The licensee must give ninety days written notice before terminating the agreement. "
    "Payment is due within 30 days of the invoice date.",
    "This agreement is governed by the laws of the State of New York. The initial term is five years.",
]


def fake_embed(texts):
    """Hashed bag of lower-cased words, L2-normalised: shared words mean similar vectors."""
    out = np.zeros((len(texts), 256), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in re.findall(r"[a-z]+", t.lower()):
            if len(w) > 2:
                out[i, int(hashlib.md5(w[:6].encode()).hexdigest(), 16) % 256] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1, norms)


def test_number_absent_from_passages_makes_a_sentence_unsupported():
    report = check("Payment is due within 45 days of the invoice date.", PASSAGES, fake_embed)
    (s,) = report.sentences
    assert s.missing_numbers == ["45"] and not s.supported
    same = check("Payment is due within 30 days of the invoice date.", PASSAGES, fake_embed).sentences[0]
    assert same.supported and same.missing_numbers == [] and same.score > s.score


def test_paraphrase_is_supported_and_an_unrelated_claim_is_not():
    answer = (
        "The agreement is governed by New York State law. "
        "The licensor may audit the accounts of the licensee twice every year."
    )
    report = check(answer, PASSAGES, fake_embed)
    first, second = report.sentences
    assert first.supported and first.best_passage == 1
    assert not second.supported
    assert [s.text for s in report.unsupported] == [second.text]
    assert unsupported_sentences(answer, PASSAGES, fake_embed) == [second.text]
    assert drop(answer, report) == first.text


def test_short_sentences_are_not_checked_and_drop_keeps_the_rest():
    answer = "Sure. The initial term is five years. The term is twelve years."
    report = check(answer, PASSAGES, fake_embed)
    assert [s.checked for s in report.sentences] == [False, True, True]
    assert [s.supported for s in report.sentences] == [True, True, False]
    assert report.sentences[2].missing_numbers == ["12"]
    assert drop(answer, report) == "Sure. The initial term is five years."
    assert 0 < report.supported_fraction < 1


def test_no_passages_means_nothing_is_supported():
    report = check("The initial term is five years.", [], fake_embed)
    assert not report.sentences[0].supported


def test_threshold_is_applied():
    answer = "The agreement is governed by New York law."
    loose = GroundingChecker(fake_embed, threshold=0.0).check(answer, PASSAGES)
    strict = GroundingChecker(fake_embed, threshold=1.01).check(answer, PASSAGES)
    assert loose.unsupported == [] and len(strict.unsupported) == 1


def test_numbers_and_sentences():
    assert numbers("It cost $1,000.50, 3.0% and twenty; the 21st day.") == {"1000.5", "3", "20", "21"}
    text = "Dr. Smith arrived at 3 p.m. on Jan. 5. He left.\n1. First item\n2. Second item"
    assert [text[a:b] for a, b in split_sentences(text)] == [
        "Dr. Smith arrived at 3 p.m. on Jan. 5.",
        "He left.",
        "1. First item",
        "2. Second item",
    ]


@pytest.mark.slow
def test_real_embedder_paraphrase_supported_and_fabrication_not():
    from pipelines.embedding import Embedder

    embed = Embedder().embed
    answer = (
        "To end the contract, the licensee has to notify the other side in writing ninety days ahead. "
        "The vendor also guarantees 99.9% uptime for the hosted service."
    )
    report = check(answer, PASSAGES, embed, threshold=DEFAULT_THRESHOLD)
    first, second = report.sentences
    assert first.supported and first.semantic > 0.5
    assert not second.supported and second.missing_numbers == ["99.9"]
