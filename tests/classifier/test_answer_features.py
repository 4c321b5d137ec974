import math

import pytest

from classifier.answer_features import (
    ANSWER_FEATURE_NAMES,
    answer_features,
    answer_letters,
    content_terms,
    document_index,
    hedge_count,
    is_refusal,
    parse_options,
    refusal_anywhere,
)

MC_QUERY = (
    "Question 2. The rise of data science is largely due to:\n"
    "A. Reduction in data generation\n"
    "B. Rapid increase in computing capabilities and data generation\n"
    "C. Increase in computer programming skills\n"
    "D. Rise in demand for statisticians"
)
PASSAGES = [
    "The rapid increase in computing capabilities, together with data generation, drove data science. "
    "In 2012 the field employed 4,500 analysts at Acme Corp.",
]
DOCUMENT = PASSAGES[0] + " Later chapters discuss statisticians, the Zeta Protocol and revenue of 9,100 dollars."


@pytest.mark.parametrize(
    "answer",
    [
        "unanswerable",
        "Unanswerable.",
        "The passages do not contain the answer.",
        "There is no information provided in the given context about the advertising method.",
        "I'm sorry, but the provided context does not contain information about bookings.",
        "It is not specified in the provided information.",
        "文中没有提及这个问题。",
        "根据材料，无法确定答案。",
        "没有相关信息",
        "",
        None,
    ],
)
def test_refusals_are_detected_in_english_and_chinese(answer):
    assert is_refusal(answer)


@pytest.mark.parametrize(
    "answer",
    [
        "B. Rapid increase in computing capabilities and data generation",
        "10 episodes",
        "The second topic we discussed was the future of space tourism.",
        "答案是B，计算能力的快速提升。",
        "A. it does not damage the artworks",
    ],
)
def test_answers_are_not_refusals(answer):
    assert not is_refusal(answer)


def test_refusal_deep_in_a_long_answer_is_partial_not_a_refusal():
    answer = (
        "Section 11.1 renews the agreement for one-year periods unless either party gives notice. " * 4
        + "The text does not mention a renewal fee."
    )
    assert not is_refusal(answer)
    assert refusal_anywhere(answer)


def test_hedges_counted_in_both_languages():
    assert hedge_count("It may be that the author is possibly joking.") >= 2
    assert hedge_count("答案可能是B") == 1
    assert hedge_count("B") == 0


def test_chinese_terms_are_character_bigrams():
    assert "计算" in content_terms("计算能力")
    assert "能力" in content_terms("计算能力")


def test_feature_names_and_order():
    f = answer_features(MC_QUERY, "B", PASSAGES, DOCUMENT)
    assert list(f) == ANSWER_FEATURE_NAMES
    assert all(isinstance(v, float) for v in f.values())


def test_multiple_choice_letter_and_option_text():
    options = parse_options(MC_QUERY)
    assert sorted(options) == ["A", "B", "C", "D"]
    assert answer_letters("The answer is (C).", options) == ["C"]
    assert answer_letters("B. Rapid increase", options) == ["B"]
    text_b = "Rapid increase in computing capabilities and data generation"
    good = answer_features(MC_QUERY, "B. " + text_b, PASSAGES, DOCUMENT)
    assert good["mc_question"] == 1.0
    assert good["mc_letter_valid"] == 1.0
    assert good["mc_option_text_match"] == pytest.approx(1.0)
    assert good["mc_letter_text_agree"] == 1.0
    assert good["mc_chosen_is_best_supported"] == 1.0
    assert good["mc_support_margin"] > 0
    # names D (a letter) but repeats B's text: disagreement; D is not what the passages support
    odd = answer_features(MC_QUERY, "D. " + text_b, PASSAGES, DOCUMENT)
    assert odd["mc_letter_text_agree"] == 0.0
    assert odd["mc_chosen_is_best_supported"] == 0.0
    assert odd["mc_support_margin"] < 0
    none = answer_features(MC_QUERY, "I cannot determine this from the passages.", PASSAGES, DOCUMENT)
    assert none["mc_letter_valid"] == 0.0
    assert none["ans_refusal"] == 1.0


def test_open_question_has_no_multiple_choice_values():
    f = answer_features("How many analysts did Acme employ?", "4,500 analysts", PASSAGES, DOCUMENT)
    assert f["mc_question"] == 0.0
    assert math.isnan(f["mc_letter_valid"])


def test_numbers_absent_from_passages_lower_number_support():
    query = "How many analysts did Acme employ?"
    supported = answer_features(query, "Acme employed 4,500 analysts in 2012.", PASSAGES, DOCUMENT)
    invented = answer_features(query, "Acme employed 7,300 analysts in 2019.", PASSAGES, DOCUMENT)
    assert supported["ans_number_support_passages"] == 1.0
    assert invented["ans_number_support_passages"] == 0.0
    assert invented["ans_number_support_document"] == 0.0


def test_terms_in_document_but_not_passages_open_a_support_gap():
    query = "What does the later chapter discuss?"
    f = answer_features(query, "The Zeta Protocol", PASSAGES, DOCUMENT)
    assert f["ans_support_passages"] == 0.0
    assert f["ans_support_document"] == 1.0
    assert f["ans_support_gap"] == 1.0
    grounded = answer_features(query, "computing capabilities", PASSAGES, DOCUMENT)
    assert grounded["ans_support_passages"] == 1.0


def test_document_features_nan_without_document_and_precomputed_index_matches():
    query = "How many analysts did Acme employ?"
    no_doc = answer_features(query, "4,500", PASSAGES, None)
    assert math.isnan(no_doc["ans_support_document"])
    assert math.isnan(no_doc["ans_number_support_document"])
    terms, bigrams, nums = document_index(DOCUMENT)
    with_text = answer_features(query, "4,500 analysts at Acme", PASSAGES, DOCUMENT)
    with_index = answer_features(
        query,
        "4,500 analysts at Acme",
        PASSAGES,
        None,
        document_terms_set=terms,
        document_bigrams=bigrams,
        document_numbers=nums,
    )
    assert with_text == pytest.approx(with_index, nan_ok=True)


def test_optional_logprobs_and_pre_route_probability():
    f = answer_features("Who?", "Acme", PASSAGES, DOCUMENT)
    assert math.isnan(f["ans_logprob_mean"]) and math.isnan(f["pre_route_probability"])
    g = answer_features(
        "Who?", "Acme", PASSAGES, DOCUMENT, logprobs=[-0.1, -2.0, float("nan")], pre_route_probability=0.7
    )
    assert g["ans_logprob_mean"] == pytest.approx(-1.05)
    assert g["ans_logprob_min"] == pytest.approx(-2.0)
    assert g["pre_route_probability"] == pytest.approx(0.7)


def test_question_names_absent_from_the_document():
    from classifier.answer_features import answer_features, query_names

    assert query_names("Why did Miss Winslow reject Mr. Rhodes's offer in 1921? Then what?") >= {
        "miss",
        "winslow",
        "rhodes",
        "1921",
    }
    assert "why" not in query_names("Why did Miss Winslow go?") and "then" not in query_names("A b. Then c?")
    doc = "Miss Winslow lived in Florence. She refused the room in 1921."
    present = answer_features("Why did Miss Winslow refuse the room?", "unanswerable", [], doc)
    absent = answer_features("Why did Captain Nemo refuse the submarine?", "unanswerable", [], doc)
    assert present["query_names_absent_document"] == 0.0 and absent["query_names_absent_document"] == 1.0
    assert absent["query_bigrams_absent_document"] == 1.0 > present["query_bigrams_absent_document"]
    assert math.isnan(answer_features("what is it?", "x", [], doc)["query_names_absent_document"])


def test_retrieval_and_support_inputs_pass_through_or_are_missing():
    from classifier.answer_features import answer_features

    f = answer_features(
        "q?",
        "a",
        ["p"],
        None,
        retrieval={"top_score": 0.7, "top_margin": 0.1, "hit_spread": 0.5},
        support={"ans_passage_similarity": 0.8},
    )
    assert f["ret_top_score"] == 0.7 and f["ret_top_margin"] == 0.1 and f["ret_hit_spread"] == 0.5
    assert f["ans_passage_similarity"] == 0.8
    assert math.isnan(f["ret_score_spread"]) and math.isnan(f["ans_sentence_support_min"])
    bare = answer_features("q?", "a", ["p"], None)
    assert math.isnan(bare["ret_top_score"]) and math.isnan(bare["query_passage_similarity"])


def test_a_question_about_order_counts_or_the_whole_has_global_cues():
    asks_order = answer_features("What is the first topic we discussed?", "Art in society.", PASSAGES, DOCUMENT)
    asks_fact = answer_features("Which firm employed the analysts?", "Acme Corp.", PASSAGES, DOCUMENT)
    assert asks_order["query_global_cue"] == 2.0  # "first", "topic"
    assert asks_fact["query_global_cue"] == 0.0
    compares = answer_features("How do both chapters differ?", "They differ in scope.", PASSAGES, None)
    assert compares["query_global_cue"] == 2.0  # no document needed


def test_question_terms_the_document_has_but_the_passages_lack():
    # "statisticians" and "revenue" are in the document, not in the passages sent; "analysts" is in both
    query = "What revenue did the statisticians and analysts report?"
    answered = answer_features(query, "They reported 4,500 dollars.", PASSAGES, DOCUMENT)
    assert answered["query_retrieved_share"] == pytest.approx(1 / 3)
    assert answered["answer_x_unretrieved"] == pytest.approx(2 / 3)
    assert answered["refusal_x_unretrieved"] == 0.0
    refused = answer_features(query, "The passages do not mention it.", PASSAGES, DOCUMENT)
    assert refused["refusal_x_unretrieved"] == pytest.approx(2 / 3)
    assert refused["answer_x_unretrieved"] == 0.0
    # every term the document has was sent: nothing left unretrieved
    sent = answer_features("How many analysts did Acme employ?", "4,500.", PASSAGES, DOCUMENT)
    assert sent["query_retrieved_share"] == 1.0 and sent["answer_x_unretrieved"] == 0.0


def test_question_terms_absent_from_the_document():
    query = "What colour was the bathrobe of the analysts?"
    answered = answer_features(query, "It was blue.", PASSAGES, DOCUMENT)
    assert answered["query_doc_absent_terms"] == 2.0  # "colour", "bathrobe"
    assert answered["answer_x_query_absent"] == pytest.approx(2 / 3)
    assert answered["answer_x_bigrams_absent"] == pytest.approx(answered["query_bigrams_absent_document"])
    refused = answer_features(query, "unanswerable", PASSAGES, DOCUMENT)
    assert refused["answer_x_query_absent"] == 0.0 and refused["answer_x_bigrams_absent"] == 0.0
    # without the document these are unknown, not zero
    blind = answer_features(query, "It was blue.", PASSAGES, None)
    for name in ("query_doc_absent_terms", "query_retrieved_share", "answer_x_query_absent", "answer_x_unretrieved"):
        assert math.isnan(blind[name])
