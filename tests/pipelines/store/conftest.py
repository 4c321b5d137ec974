import pytest

from pipelines.embedding import Embedder
from pipelines.store import DocumentStore
from tests.support.pipelines import STORE_SETTINGS, CountingEmbedder


@pytest.fixture(scope="module")
def base_embedder():
    return Embedder()


@pytest.fixture(scope="module")
def fp32_embedder():
    """The fp32 export (what every release wrote by default before round eight's onnx-int8): the other space."""
    return Embedder(backend="onnx")


@pytest.fixture
def embedder(base_embedder):
    return CountingEmbedder(base_embedder)


@pytest.fixture
def store(tmp_path, embedder):
    return DocumentStore(str(tmp_path / "db"), embedder, STORE_SETTINGS)
