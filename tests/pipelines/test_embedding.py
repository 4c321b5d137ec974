import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pipelines.embedding import Embedder


@pytest.fixture(scope="module")
def embedder():
    """The torch backend: the reference the ONNX backends are compared with."""
    return Embedder(batch_size=4, backend="torch")


def test_lazy_until_first_use():
    e = Embedder(backend="torch")
    assert e._documents._model is None and e._queries_model._model is None
    assert not Embedder().loaded  # the default (onnx) backend too


def test_vectors_are_normalised_float32_and_meaningful(embedder):
    vectors = embedder.embed(["The cat sat on the mat.", "A cat is sitting on a rug.", "Quarterly revenue rose 12%."])
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert vectors.dtype == np.float32 and vectors.shape == (3, embedder.dimension) and embedder.dimension == 384
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    assert embedder.embed([]).shape == (0, 384)


def test_thread_safe_and_batching_invariant(embedder):
    texts = [f"sentence number {i} about ships and harbours" for i in range(10)]
    serial = embedder.embed(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda t: embedder.embed([t])[0], texts))
    assert np.allclose(np.stack(parallel), serial, atol=1e-5)


def test_queries_use_their_own_model_copy_and_are_remembered(embedder):
    question = "Which harbour has the deepest berth?"
    vector = embedder.embed_query(question)
    assert np.allclose(vector, embedder.embed([question])[0], atol=1e-5)  # the same model, another copy
    assert embedder.embed_query(question) is vector  # remembered, and read-only since requests share it
    assert not vector.flags.writeable
    with embedder._documents.lock:  # a document batch holding its copy does not hold up a question
        assert embedder.embed_query("a question asked during an ingestion").shape == (384,)


def test_remembered_questions_are_kept_apart_by_scope(embedder):
    """A question remembered for one key is embedded again for another: the cache's speed never tells one key
    what another asked. The key scope is passed explicitly (pipelines.scope)."""
    from pipelines.scope import KeyScope

    question = "Which pier does the ferry to the outer islands leave from?"

    def asked_by(key):
        return embedder.embed_query(question, KeyScope(key))

    alice = asked_by("alice")
    assert asked_by("alice") is alice  # her own question, remembered
    bob = asked_by("bob")
    assert bob is not alice and np.allclose(bob, alice)  # bob's is embedded anew, to the same vector
    assert asked_by("bob") is bob
    unscoped = embedder.embed_query(question)  # no scope (the CLI): a third, shared entry
    assert unscoped is not alice and unscoped is not bob and embedder.embed_query(question) is unscoped


TEXTS = [
    "The cat sat on the mat.",
    "A cat is sitting on a rug.",
    "Quarterly revenue rose 12%.",
    "Open valve V2 before starting pump P1; " * 40,
]  # the last one longer than the model's 256 word pieces


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return tmp_path_factory.mktemp("models")


def test_onnx_int8_is_the_default_backend_and_stores_written_before_are_fp32():
    from pipelines.embedding import embedding_space, legacy_space
    from pipelines.settings import RagSettings

    assert Embedder().backend == "onnx-int8" and RagSettings().embedding_backend == "onnx-int8"
    # rows written before spaces were recorded came from the fp32 default of then (torch, onnx): not the new default's
    assert legacy_space() == embedding_space(None, "onnx") != Embedder().space


def test_onnx_backend_gives_the_torch_vectors_from_a_cached_local_export(embedder, onnx_cache):
    reference = embedder.embed(TEXTS)
    onnx = Embedder(batch_size=3, backend="onnx", cache_dir=onnx_cache)
    vectors = onnx.embed(TEXTS)  # exported from the packaged model on first use (HF_HUB_OFFLINE=1: no download)
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape and onnx.dimension == 384
    assert np.allclose(vectors, reference, atol=2e-4)  # sorted-by-length batches, truncation as torch's
    assert np.allclose(onnx.embed_query(TEXTS[0]), reference[0], atol=2e-4)
    exported = list(onnx_cache.glob("*.onnx"))
    assert len(exported) == 1
    stamp = exported[0].stat().st_mtime_ns
    again = Embedder(backend="onnx", cache_dir=onnx_cache)
    assert np.allclose(again.embed(TEXTS[:1]), reference[:1], atol=2e-4)
    assert exported[0].stat().st_mtime_ns == stamp  # the cached export is reused, not made again


def test_onnx_counts_the_word_pieces_torch_reads(embedder, onnx_cache):
    onnx = Embedder(backend="onnx", cache_dir=onnx_cache)
    counts = onnx.token_counts(TEXTS)
    assert counts == embedder.token_counts(TEXTS)
    assert counts[0] == 9 and counts[-1] == 256  # [CLS] ... [SEP]; the long one truncated at the model's 256


def test_onnx_int8_backend_stays_close_and_keeps_the_ranking(embedder, onnx_cache):
    reference = embedder.embed(TEXTS)
    vectors = Embedder(backend="onnx-int8", cache_dir=onnx_cache).embed(TEXTS)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert (vectors * reference).sum(axis=1).min() > 0.97  # per-channel weights (0.85-0.9 per tensor)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    assert any(p.name.endswith("-int8.onnx") for p in onnx_cache.glob("*.onnx"))


def test_an_onnx_int8_vector_is_the_texts_own_whatever_it_is_embedded_with(onnx_cache):
    """Dynamic int8 quantises a run's activations with one scale for the run: batched, a text's vector moved with the
    texts beside it (cosine 0.99); one text per run, a chunk embedded at ingestion and the same text embedded alone
    (a question, the replay's store, the live first pass) get the same vector."""
    int8 = Embedder(backend="onnx-int8", cache_dir=onnx_cache)
    together = int8.embed(TEXTS)
    alone = np.stack([int8.embed([t])[0] for t in TEXTS])
    assert np.allclose(together, alone, atol=1e-6)
    assert np.allclose(int8.embed(TEXTS[::-1])[::-1], together, atol=1e-6)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="onnx-int8"):
        Embedder(backend="tensorrt")


def test_onnx_serves_documents_and_questions_from_one_session_without_torch(onnx_cache):
    """A process on the onnx backend imports neither torch nor sentence-transformers (the export, made once per
    model version into the shared cache, runs in a child process), and holds one session for both kinds of text."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from pipelines.embedding import Embedder\n"
        f"e = Embedder(backend='onnx', cache_dir={str(onnx_cache)!r})\n"
        "e.load()\n"
        "assert e._documents is e._queries_model\n"
        "v = e.embed(['a document about harbours']); q = e.embed_query('which harbour?')\n"
        "assert v.shape == (1, 384) and q.shape == (384,)\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert any(not p.name.endswith("-int8.onnx") for p in onnx_cache.glob("*.onnx"))  # the cache it was given


def test_onnx_export_is_keyed_by_the_model_files_not_their_place(tmp_path):
    import shutil

    from pipelines.embedding import default_model_path, model_key

    copy = tmp_path / "model"
    shutil.copytree(default_model_path(), copy)
    assert model_key(str(copy)) == model_key(None)  # the same weights elsewhere: the same export
    config = copy / "config.json"
    config.write_text(config.read_text().replace("}", ', "changed": true}', 1))
    assert model_key(str(copy)) != model_key(None)  # another version of the model: another export


def test_a_failed_export_says_why(tmp_path):
    from pipelines.embedding import onnx_model_file

    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="exporting .* to ONNX failed"):
        onnx_model_file(str(broken), quantized=False, cache_dir=tmp_path / "cache")


def test_the_default_export_cache_is_shared_by_data_directories(monkeypatch, tmp_path):
    from pipelines.embedding import default_cache_dir

    monkeypatch.delenv("SELFROUTE_MODEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for data_dir in ("a", "b"):
        monkeypatch.setenv("SELFROUTE_DATA_DIR", str(tmp_path / data_dir))
        assert default_cache_dir() == tmp_path / "selfroute" / "models"
    monkeypatch.setenv("SELFROUTE_MODEL_CACHE", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"


def test_onnx_runs_are_sorted_batches_within_a_word_piece_budget():
    """Texts sorted by length go to onnxruntime in runs of at most batch_size texts and RUN_TOKENS padded word
    pieces (a run of 64 long chunks costs ~1.5x the CPU per chunk of short runs), every text in exactly one run."""
    from pipelines.embedding import RUN_TOKENS, run_batches

    lengths = np.sort(np.array([5] * 100 + [200] * 20 + [256] * 3 + [9999]))
    runs = run_batches(lengths, 64)
    assert [(r.start, r.stop) for r in runs] == [(0, 64), (64, 100), (100, 110), (110, 120), (120, 123), (123, 124)]
    for r in runs:
        assert r.stop - r.start <= 64
        assert (r.stop - r.start) * lengths[r.stop - 1] <= RUN_TOKENS or r.stop - r.start == 1  # one text at least
    assert run_batches(np.array([3, 4, 5]), 1) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert run_batches(np.array([], dtype=int), 64) == []


def test_onnx_export_is_the_fused_graph(onnx_cache):
    """The fp32 export is onnxruntime's fused transformer graph (Attention, SkipLayerNormalization kernels), and the
    int8 one quantises it (its attention too); the vectors are checked against torch's above."""
    import onnx

    from pipelines.embedding import onnx_model_file

    def ops(quantized):
        return {n.op_type for n in onnx.load(str(onnx_model_file(None, quantized, onnx_cache))).graph.node}

    fp32 = ops(False)
    assert {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization"} <= fp32 and "Softmax" not in fp32
    assert {"QAttention", "MatMulInteger"} <= ops(True)


def test_a_fused_graph_that_changes_the_vectors_is_not_used(tmp_path, monkeypatch):
    """fuse() keeps the unfused export where the fused graph's vectors differ (here: any difference counts)."""
    pytest.importorskip("onnxruntime")
    from pipelines import onnx_export
    from pipelines.embedding import default_model_path

    plain = tmp_path / "plain.onnx"
    config, inputs = onnx_export.export_plain(default_model_path(), plain)
    assert onnx_export.fuse(plain, tmp_path / "fused.onnx", config, inputs)
    monkeypatch.setattr(onnx_export, "FUSED_TOLERANCE", -1.0)
    assert not onnx_export.fuse(plain, tmp_path / "refused.onnx", config, inputs)
    assert not (tmp_path / "refused.onnx").exists()


def test_openvino_backend_gives_the_onnx_vectors_from_the_same_export(embedder, onnx_cache):
    """OpenVINO compiles the fp32 export (bfloat16 where the CPU has it): vectors at cosine >= 0.9999 to torch's, and
    its per-thread infer requests keep concurrent documents and questions apart."""
    pytest.importorskip("openvino")
    reference = embedder.embed(TEXTS)
    ov = Embedder(batch_size=3, backend="openvino", cache_dir=onnx_cache)
    vectors = ov.embed(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape and ov.dimension == 384
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert (vectors * reference).sum(axis=1).min() > 0.9999
    assert ov.token_counts(TEXTS) == embedder.token_counts(TEXTS)
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda t: ov.embed([t])[0], TEXTS * 3))
    assert np.allclose(np.stack(parallel), np.concatenate([vectors] * 3), atol=1e-3)
    assert float(ov.embed_query(TEXTS[0]) @ reference[0]) > 0.9999
