"""Shared helpers for the pipelines tests: a counting embedder wrapper and a small synthetic corpus."""

from __future__ import annotations

from pathlib import Path

from pipelines.documents import Document
from pipelines.embedding import Embedder
from pipelines.settings import ChunkingSettings, RagSettings

MANUAL_PATH = Path(__file__).parents[1] / "pipelines" / "fixtures" / "manual.md"
# small chunks, so the store tests' documents make several each
STORE_SETTINGS = RagSettings(chunking=ChunkingSettings(chunk_tokens=64, chunk_overlap=8), top_k=5)

TOPICS = [
    ("Orchard", "apple trees need pruning in late winter and the orchard is irrigated twice a week"),
    ("Bakery", "sourdough bread rises overnight and the ovens are heated to two hundred and forty degrees"),
    ("Observatory", "the telescope dome opens after sunset and the mirror is cleaned every spring"),
    ("Library", "rare books are kept in a climate controlled room and loans last three weeks"),
    ("Railway", "the night train departs at eleven and the sleeper cars have four berths each"),
]


def distractor_documents() -> list[Document]:
    docs = []
    for i, (name, fact) in enumerate(TOPICS):
        text = f"# {name} handbook\n\n" + "\n\n".join(
            f"## {j + 1}. {name} practice {j + 1}\n\nIn the {name.lower()}, {fact}. Staff record notes number {j} daily."
            for j in range(4)
        )
        docs.append(Document(f"{name.lower()}.md", text, title=f"{name} handbook"))
    return docs


def manual_document() -> Document:
    return Document("manual.md", MANUAL_PATH.read_text(), title="Harbor Pump Operations Manual")


class CountingEmbedder(Embedder):
    """A real Embedder that counts the document texts (calls, texts) and the questions it embeds."""

    def __init__(self, inner: Embedder):
        super().__init__(inner.model_path, inner.batch_size)
        self._inner = inner
        self.texts_embedded = 0
        self.calls = 0
        self.queries_embedded = 0

    def embed(self, texts, progress=None, should_stop=None):
        self.calls += 1
        self.texts_embedded += len(texts)
        return self._inner.embed(texts, progress=progress, should_stop=should_stop)

    def embed_queries(self, texts):
        self.queries_embedded += len(texts)
        return self._inner.embed_queries(texts)

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    @property
    def space(self) -> str:  # type: ignore[override]
        return self._inner.space


class SlowEmbedder(CountingEmbedder):
    """Document batches take `delay` seconds more: an ingestion long enough to stop midway."""

    def __init__(self, inner: Embedder, delay: float):
        super().__init__(inner)
        self.delay = delay

    def embed(self, texts, progress=None, should_stop=None):
        import time

        time.sleep(self.delay)
        return super().embed(texts, progress, should_stop)
