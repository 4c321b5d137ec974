"""The verifier's gateway-side inputs: the retrieval pass's signals and the answer's support in embedding space."""

from types import SimpleNamespace

import numpy as np
import pytest

from gateway.routing.answer_support import answer_support, hit_positions, hit_spread, retrieval_inputs


def test_hit_spread_counts_separate_places():
    assert hit_spread([]) is None
    assert hit_spread([("d", 3), ("d", 4), ("d", 5)]) == pytest.approx(1 / 3)  # one place
    assert hit_spread([("d", 0), ("d", 40), ("e", 0)]) == 1.0  # every hit elsewhere
    assert hit_spread([("d", 0), ("d", 2), ("d", 9), ("d", 10)]) == pytest.approx(2 / 4)


def _hit(doc, position, score, rank, text="alpha beta"):
    return SimpleNamespace(
        chunk=SimpleNamespace(doc_id=doc, position=position, text=text), vector_score=score, rank=rank
    )


def test_retrieval_inputs_are_the_pre_route_features_retrieval_part_and_the_spread():
    retrieval = SimpleNamespace(
        hits=[_hit("d", 1, 0.8, 1), _hit("d", 2, 0.6, 2), _hit("d", 3, 0.9, 0), _hit("d", 30, 0.5, 3)]
    )
    values = retrieval_inputs("alpha gamma?", retrieval)
    assert values["top_score"] == pytest.approx(0.8) and values["top_margin"] == pytest.approx(0.2)
    assert values["score_spread"] == pytest.approx(0.3) and values["term_coverage"] == pytest.approx(0.5)
    assert values["hit_spread"] == pytest.approx(2 / 3)  # the neighbour (rank 0) is no evidence
    assert hit_positions(retrieval) == [("d", 1), ("d", 2), ("d", 30)]
    assert retrieval_inputs("q", None) is None and retrieval_inputs("q", SimpleNamespace(hits=[])) is None


def fake_embed(texts):
    """Deterministic unit vectors: a text about "harbour" points one way, anything else another."""
    rows = [[1.0, 0.0] if "harbour" in t.lower() else [0.0, 1.0] for t in texts]
    return np.asarray(rows, dtype=np.float32)


def test_answer_support_per_sentence_against_the_passages():
    passages = ["The harbour master keeps the keys."]
    grounded = answer_support(
        "Who keeps the keys?", "The harbour master. He keeps them at the harbour.", passages, fake_embed
    )
    assert grounded["ans_passage_similarity"] == 1.0 and grounded["ans_sentence_support_min"] == 1.0
    mixed = answer_support("Who?", "The harbour master. A dragon ate them.", passages, fake_embed)
    assert mixed["ans_sentence_support_mean"] == pytest.approx(0.5) and mixed["ans_sentence_support_min"] == 0.0
    assert mixed["query_passage_similarity"] == 0.0
    assert answer_support("q", "a", passages, None) is None and answer_support("q", "", passages, fake_embed) is None
    assert answer_support("q", "a", [" "], fake_embed) is None


def test_the_check_embeds_only_for_a_verifier_that_reads_support():
    from classifier.estimators import VERIFIER, build_pipeline
    from classifier.verifier import VerifierModel
    from gateway.routing.escalation import CheapAnswer, CheapAnswerCheck
    from tests.support.policies import verified_policy

    calls = []

    def counting_embed(texts):
        calls.append(len(texts))
        return fake_embed(texts)

    rows = [{"ans_passage_similarity": float(i % 2), "ans_refusal": 0.0} for i in range(40)]
    labels = [i % 2 for i in range(40)]
    policy = verified_policy()
    answer = CheapAnswer("The harbour master.", "Who?", ["The harbour master keeps the keys."], embed=counting_embed)
    plain = VerifierModel(build_pipeline("logistic", VERIFIER), ["ans_refusal"]).fit(rows, labels)
    assert not CheapAnswerCheck(policy, plain).needs_embeddings
    CheapAnswerCheck(policy, plain).score(answer)
    assert calls == []
    reads = VerifierModel(build_pipeline("logistic", VERIFIER), ["ans_passage_similarity"]).fit(rows, labels)
    check = CheapAnswerCheck(policy, reads)
    assert check.needs_embeddings
    assert check.score(answer) > check.score(CheapAnswer("A dragon.", "Who?", answer.passages, embed=counting_embed))
    assert calls


def test_logprobs_are_asked_for_taken_and_hidden_from_a_client_that_did_not_ask():
    from gateway.routing.answer_support import take_logprobs, with_logprobs

    assert with_logprobs({"a": 1}, True, "openai/x") == {"a": 1, "logprobs": True}
    assert with_logprobs({"a": 1}, False, "openai/x") == {"a": 1}
    assert with_logprobs({"a": 1}, True, "local/smollm2-135m-instruct") == {"a": 1}
    completion = {
        "choices": [
            {
                "message": {"content": "x y"},
                "logprobs": {
                    "content": [
                        {"token": "x", "logprob": -0.5},
                        {"token": "y", "logprob": -2.0},
                        {"token": "z", "logprob": None},
                    ]
                },
            }
        ]
    }
    assert take_logprobs(completion, {}) == [-0.5, -2.0]
    assert completion["choices"][0]["logprobs"] is None  # the client did not ask
    kept = {"choices": [{"logprobs": {"content": [{"logprob": -1.0}]}}]}
    assert take_logprobs(kept, {"logprobs": True}) == [-1.0] and kept["choices"][0]["logprobs"] is not None
    assert take_logprobs({"choices": [{"logprobs": None}]}, {}) is None and take_logprobs({}, {}) is None


def test_answer_support_reads_the_passage_vectors_given_instead_of_embedding_the_passages():
    asked = []

    def counting_embed(texts):
        asked.extend(texts)
        return fake_embed(texts)

    answer = "The harbour master. A dragon ate them."
    from_vectors = answer_support(
        "Who?", answer, ["ignored text"], counting_embed, passage_vectors=np.asarray([[1.0, 0.0]], np.float32)
    )
    assert "ignored text" not in asked and len(asked) == 2 + 2  # answer, question, its two sentences
    assert from_vectors == answer_support("Who?", answer, ["The harbour master keeps the keys."], fake_embed)
    # vectors alone are enough (no passage texts), an empty array is no passages
    assert answer_support("Who?", answer, [], fake_embed, np.asarray([[1.0, 0.0]], np.float32)) == from_vectors
    assert answer_support("Who?", answer, [], fake_embed, np.zeros((0, 2), np.float32)) is None


@pytest.fixture(scope="module")
def embedder():
    from pipelines.embedding import Embedder

    return Embedder()


def _example(text: str):
    from gateway.evaluation.examples import Example
    from pipelines.documents import Document

    question = "What is the maintenance password for the Zephyr pump?"
    return Example(
        question, [Document(id="doc-1", text=text)], "doc-1", {"rag_pred": "x", "rag_score": 1, "lc_score": 0}
    )


def test_the_chunks_sent_are_read_from_the_store_live_and_offline_alike(embedder, tmp_path):
    """The live check (sent_chunk_vectors over the request's retrieval) and the replay (RouteInputBuilder.sent_vectors,
    its chunk list cached) read the same stored vectors; they equal the chunks' texts embedded now within float
    tolerance, and a chunk the store does not hold is embedded."""
    from gateway.evaluation.examples import RouteInputBuilder
    from gateway.routing.answer_support import sent_chunk_vectors, stored_chunk_vectors
    from policies.loader import load_policy
    from tests.support.routed import manual

    policy, _ = load_policy(None)
    example = _example(manual())
    builder = RouteInputBuilder(policy, tmp_path / "lancedb", cache_dir=tmp_path / "cache", embedder=embedder)
    retrieval = builder.rag.retrieve_for(builder._request(example))
    chunks = [c.chunk for c in retrieval.selected]
    assert len(chunks) > 1
    live = sent_chunk_vectors(builder.store, retrieval)
    assert live.shape == (len(chunks), embedder.dimension)
    np.testing.assert_allclose(live, embedder.embed([c.text for c in chunks]), atol=1e-5)
    np.testing.assert_array_equal(builder.sent_vectors(example), live)
    again = RouteInputBuilder(policy, tmp_path / "lancedb", cache_dir=tmp_path / "cache", embedder=embedder)
    np.testing.assert_array_equal(again.sent_vectors(example), live)  # the chunk list from the cache file
    # a chunk not in the store (a position past the document's end, a collection gone) is embedded
    assert stored_chunk_vectors(builder.store, retrieval.collection, [(chunks[0].doc_id, 10_000)]) == [None]
    gone = SimpleNamespace(collection="no-such-collection", selected=retrieval.selected)
    np.testing.assert_allclose(sent_chunk_vectors(builder.store, gone), live, atol=1e-5)
    assert sent_chunk_vectors(builder.store, None) is None
