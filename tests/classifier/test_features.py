import math

import pytest

from classifier.features import (
    FEATURE_NAMES,
    DocumentStats,
    RetrievalSignals,
    extract_features,
    feature_vector,
    query_features,
    question_type,
)

STATS = DocumentStats(context_tokens=4000, max_document_tokens=3000, n_documents=2, n_sections=7, cross_ref_count=10)


def test_policy_rule_features_exist_in_a_stable_order():
    for name in (
        "context_tokens",
        "max_document_tokens",
        "cross_ref_count",
        "cross_ref_density",
        "n_documents",
        "n_sections",
        "top_score",
    ):
        assert name in FEATURE_NAMES
    assert len(FEATURE_NAMES) == len(set(FEATURE_NAMES))
    features = extract_features("Who wrote it?", STATS, None)
    assert list(features) == FEATURE_NAMES


@pytest.mark.parametrize(
    "query, expected",
    [
        ("What is the boiling point of water?", "what"),
        ("Who signed the agreement?", "who"),
        ("When does the lease end?", "when"),
        ("Where is the head office?", "where"),
        ("Which party pays the fees?", "which"),
        ("How is the fee calculated?", "how"),
        ("Why did the committee resign?", "why"),
        ("Is the licence transferable?", "yes_no"),
        ("Does the contract allow assignment?", "yes_no"),
        ("Summarize the discussion.", "summary"),
        ("What is the paper about?", "summary"),
        ("List the obligations of the buyer.", "list"),
        ("In 1990, who won the cup?", "who"),
        ("Tell me a story", "other"),
    ],
)
def test_question_types(query, expected):
    assert question_type(query) == expected


def test_multiple_choice_in_both_option_styles():
    lettered = "Question 3. Which item is not big data?\nA. Volume\nB. Velocity\nC. Variety\nD. Valuation"
    bracketed = "Why did he leave?\n\n (A) He was bored. \n (B) He was tired. \n (C) He was called away."
    for query, options in ((lettered, 4), (bracketed, 3)):
        features = query_features(query)
        assert features["qtype_multiple_choice"] == 1.0
        assert features["n_options"] == options
    # the options are not counted as question words, and "Question 3." numbering is dropped
    assert query_features(lettered)["query_words"] == len("Which item is not big data".split())
    assert query_features(lettered)["query_numbers"] == 0.0


def test_self_route_failure_cues():
    summary = query_features("Summarize the main idea of the lecture overall.")
    assert summary["cue_summary"] == 1.0 and summary["cue_implicit"] == 1.0
    multi = query_features("How did revenue change after the merger compared to before, and why?")
    assert multi["cue_multi_step"] >= 3
    ordinal = query_features("What is the second topic we discussed?")
    assert ordinal["cue_ordinal"] == 1.0 and ordinal["cue_implicit"] == 1.0
    long_q = query_features(" ".join(["word"] * 31) + "?")
    assert long_q["query_long_complex"] == 1.0
    plain = query_features("Who is the keeper?")
    assert plain["cue_summary"] == plain["cue_multi_step"] == plain["cue_ordinal"] == plain["query_long_complex"] == 0


def test_document_features_and_density():
    features = extract_features("Who?", STATS, None)
    assert features["context_tokens"] == 4000
    assert features["max_document_tokens"] == 3000
    assert features["n_documents"] == 2 and features["n_sections"] == 7
    assert features["cross_ref_count"] == 10
    assert features["cross_ref_density"] == pytest.approx(2.5)  # 10 per 4k tokens
    assert DocumentStats(0, 0, 0, 0, 0).cross_ref_density == 0.0


def test_retrieval_features():
    signals = RetrievalSignals(
        scores=[0.62, 0.71, 0.40, 0.55],
        doc_ids=["a", "a", "b", "c"],
        texts=["The keeper of the harbour is Ada.", "Harbour tide gauge", "copper roof", "visitors"],
    )
    features = extract_features("Who is the keeper of the harbour?", STATS, signals)
    assert features["has_retrieval"] == 1.0
    assert features["top_score"] == pytest.approx(0.71)
    assert features["top_margin"] == pytest.approx(0.71 - 0.62)
    assert features["score_spread"] == pytest.approx(0.71 - 0.40)
    assert features["score_mean"] == pytest.approx((0.62 + 0.71 + 0.40 + 0.55) / 4)
    assert features["n_distinct_docs"] == 3 and features["distinct_doc_share"] == pytest.approx(0.75)
    # content terms: keeper, harbour -> both in the chunks; the first chunk (rank order) has both too
    assert features["term_coverage"] == 1.0 and features["top_term_coverage"] == 1.0
    partial = extract_features("Who is the keeper of the lighthouse?", STATS, signals)
    assert partial["term_coverage"] == pytest.approx(0.5)


def test_no_retrieval_pass_gives_missing_values():
    features = extract_features("Who?", STATS, None)
    assert features["has_retrieval"] == 0.0
    assert math.isnan(features["top_score"]) and math.isnan(features["term_coverage"])
    assert len(feature_vector(features)) == len(FEATURE_NAMES)
