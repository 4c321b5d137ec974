"""Fixtures of the routed-gateway tests: one MiniLM per module, the toy verifier saved as a model file."""

import pytest

from pipelines.embedding import Embedder
from tests.support.routed import toy_verifier


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture(scope="module")
def verifier_file(tmp_path_factory):
    from gateway.routing.model_files import save_verifier

    path = tmp_path_factory.mktemp("verifier") / "toy.skops"
    save_verifier(toy_verifier(), path)
    return path
