"""The routing inputs the replay builds per example: here, the long prompt's cacheable document block."""

import pytest

from gateway.evaluation.examples import RouteInputBuilder, load_examples
from pipelines.base import ContextRequest
from pipelines.embedding import Embedder
from pipelines.long_context import LongContextPipeline, split_question
from pipelines.messages import TOKENS_PER_MESSAGE
from pipelines.tokens import count_tokens
from policies.loader import load_policy
from tests.support.routing import write_paired_fixture


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


def block_tokens(policy, example, window: int) -> int:
    """The document block as the gateway sends it, counted on its text."""
    request = ContextRequest(
        question=example.query, messages=[{"role": "user", "content": example.query}], documents=example.documents
    )
    prompt = LongContextPipeline(policy.long_context, window_tokens=window).prepare(request)
    return count_tokens(split_question(prompt.messages[-1]["content"])[0])


def test_the_long_prompts_document_block_is_recorded_when_it_is_stable(tmp_path, embedder, monkeypatch):
    policy, _ = load_policy()
    paired, docs = write_paired_fixture(tmp_path)
    examples = load_examples(paired, docs)[:2]  # two questions on one document
    assert examples[0].doc_ids == examples[1].doc_ids

    def builder(window: int) -> RouteInputBuilder:
        return RouteInputBuilder(
            policy, tmp_path / "lancedb", window_tokens=window, cache_dir=tmp_path / "cache", embedder=embedder
        )

    first, second = builder(16000).all_inputs(examples, progress=False)
    # the whole document fits: both questions share its block, counted from the packed parts (within a token of
    # the separator the question part starts with)
    assert first.long_prefix_tokens > 1024 and first.long_prefix_tokens == second.long_prefix_tokens
    assert abs(first.long_prefix_tokens - block_tokens(policy, examples[0], 16000)) <= 1
    # the rest of the prompt: the question part and the message's own tokens
    rest = count_tokens(f"Question: {examples[0].query}") + TOKENS_PER_MESSAGE
    assert first.long_prompt_tokens - first.long_prefix_tokens == rest
    # a window the document does not fit: units are chosen per question, so no block is cacheable
    narrow = builder(1200).inputs(examples[0])
    assert narrow.long_prefix_tokens == 0 and narrow.long_prompt_tokens <= 1200

    # read back from the cache under --data-dir without packing again
    cached = builder(16000)
    monkeypatch.setattr(cached, "_long_prompt", lambda example: pytest.fail("packed again"))
    assert cached.inputs(examples[0]) == first
    # a cache written before the block was recorded: one packing fills the missing entry
    older = builder(16000)
    del older._cache[older._key(examples[1], "long_prefix")]
    calls = []
    original = older._long_prompt
    monkeypatch.setattr(older, "_long_prompt", lambda example: calls.append(example) or original(example))
    assert older.inputs(examples[1]) == second and len(calls) == 1


def test_several_files_are_corpora_with_their_own_groups_and_windows(tmp_path):
    import json

    from gateway.evaluation.examples import ExampleFileError, corpus_windows, load_corpora

    a, docs = write_paired_fixture(tmp_path / "lara")
    (tmp_path / "leval").mkdir()
    b = tmp_path / "leval" / "paired.jsonl"
    rows = [json.loads(line) for line in a.read_text().splitlines()][:4]
    rows[0]["corpus"] = "named"
    b.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = load_corpora([(a, docs), (b, docs)])
    assert [e.corpus for e in examples[-4:]] == ["named", "leval", "leval", "leval"]
    assert examples[0].corpus == "lara" and examples[0].group.startswith("lara/")
    assert examples[0].model == "lara-model"  # no `model` field: the corpus's one unnamed model
    single = load_corpora([(a, docs)])
    assert single[0].group == load_examples(a, docs)[0].group  # one file: groups as before
    assert corpus_windows(single, None) == {"lara": None}
    assert corpus_windows(examples, [16385, 128000]) == {"lara": 16385, "leval": 128000}
    with pytest.raises(ExampleFileError):
        corpus_windows(single, [1, 2])
    with pytest.raises(ExampleFileError, match="twice"):
        load_corpora([(a, docs), (a, docs)])


def test_the_replay_reads_embedded_documents_and_keys_its_cache_without_the_first_pass(tmp_path, embedder):
    """rag.first_pass_candidates only answers a deployment's first questions while new documents are embedded: the
    replay embeds them first (0), and its cache key leaves the setting out, so caches written before it existed are
    read again."""
    policy, _ = load_policy()
    assert policy.rag.first_pass_candidates > 0
    paired, docs = write_paired_fixture(tmp_path)
    [example] = load_examples(paired, docs)[:1]
    builders = [
        RouteInputBuilder(p, tmp_path / "lancedb", window_tokens=16000, embedder=embedder)
        for p in (policy, policy.model_copy(update={"rag": policy.rag.model_copy(update={"first_pass_candidates": 0})}))
    ]
    assert all(b.policy.rag.first_pass_candidates == 0 and b.rag.settings.first_pass_candidates == 0 for b in builders)
    key = builders[0]._key(example, "retrieval")
    builders[1].policy = policy  # the setting itself is not part of the key
    assert builders[1]._key(example, "retrieval") == key
    builders[1].policy = policy.model_copy(update={"rag": policy.rag.model_copy(update={"top_k": 2})})
    assert builders[1]._key(example, "retrieval") != key  # a retrieval setting is


def test_the_replay_store_keeps_every_document_set_and_reads_a_dropped_ones_chunks_again(tmp_path, embedder):
    """The replay's store is the cache of every document set it reads: a policy's cap on inline collections (a
    deployment's working set) drops none of them, and the cache keys are those written under the cap. A chunk list
    recorded from a collection that is gone since (dropped under an older run's cap, or named under an older naming)
    is read from the documents' collection, embedded again."""
    import numpy as np

    policy, _ = load_policy()
    capped = policy.model_copy(
        update={"rag": policy.rag.model_copy(update={"inline_cache_collections": 1, "inline_cache_idle_seconds": 0})}
    )
    paired, docs = write_paired_fixture(tmp_path, n_docs=3)
    examples = list({tuple(e.doc_ids): e for e in load_examples(paired, docs)}.values())
    assert len(examples) == 3

    def builder(p):
        return RouteInputBuilder(p, tmp_path / "lancedb", cache_dir=tmp_path / "cache", embedder=embedder)

    first = builder(capped)
    sent = [first.sent_vectors(e) for e in examples]
    store = first.store
    assert all(store.collection(store.inline_name(e.documents)) is not None for e in examples)
    # the policy the cache is keyed by keeps the caller's cap: caches written before stay valid
    assert first.policy.rag.inline_cache_collections == 1
    # the recorded collection dropped: its chunks are read from the documents' collection, embedded again
    name = store.inline_name(examples[0].documents)
    store.delete_collection(name)
    again = builder(capped)
    np.testing.assert_allclose(again.sent_vectors(examples[0]), sent[0], atol=1e-5)
    assert again.store.collection(name) is not None


def test_the_route_input_cache_is_keyed_by_the_embedding_space_not_the_backends_name(tmp_path, monkeypatch):
    """torch, onnx and openvino give the fp32 model's vectors: one key (the caches written with torch or onnx stay
    valid); onnx-int8's vectors are another space, and a new int8 export is another again: its entries are never
    read for the old export's vectors (round six's per-channel int8 changed them under the same backend name)."""
    from pipelines.embedding import BACKEND_SPACES

    policy, _ = load_policy()
    paired, docs = write_paired_fixture(tmp_path)
    [example] = load_examples(paired, docs)[:1]

    def key(backend: str) -> str:
        rag = policy.rag.model_copy(update={"embedding_backend": backend})
        builder = RouteInputBuilder(
            policy.model_copy(update={"rag": rag}),
            tmp_path / "lancedb",
            window_tokens=16000,
            embedder=Embedder(backend=backend),
        )
        return builder._key(example, "retrieval")

    fp32 = {key(backend) for backend in ("torch", "onnx", "openvino")}
    assert len(fp32) == 1
    int8 = key("onnx-int8")
    assert int8 not in fp32
    monkeypatch.setitem(BACKEND_SPACES, "onnx-int8", "int8-another-export")
    assert key("onnx-int8") not in {int8, *fp32}
