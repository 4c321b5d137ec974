"""Loading files into Documents (.txt, .md, .pdf, .html, and files without an extension as text) and ingesting
them with a progress bar counted in chunks."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from html.parser import HTMLParser
from pathlib import Path

from pipelines.documents import Document

log = logging.getLogger(__name__)

SUPPORTED_SUFFIXES = {".txt", ".md", ".markdown", ".pdf", ".html", ".htm", ""}  # "": README, LICENSE, ... as text
_BINARY_PROBE_BYTES = 8192
_BLOCK_TAGS = {
    "p",
    "div",
    "br",
    "li",
    "ul",
    "ol",
    "tr",
    "table",
    "section",
    "article",
    "header",
    "footer",
    "blockquote",
    "pre",
    "dd",
    "dt",
    "hr",
    "main",
    "nav",
    "aside",
    "figure",
    "figcaption",
}
_SKIP_TAGS = {"script", "style", "noscript", "template", "head"}


class _HtmlText(HTMLParser):
    """Visible text of an HTML page; h1-h6 become markdown headings so sections are found."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: str | None = None
        self.first_h1: str | None = None
        self._skip = 0
        self._in_title = False
        self._heading: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag == "title":
            self._in_title = True
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
            self._heading = []
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n" if tag in {"p", "div", "section", "article", "table", "pre"} else "\n")

    def handle_endtag(self, tag):
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag == "title":
            self._in_title = False
        elif re.fullmatch(r"h[1-6]", tag):
            if tag == "h1" and self.first_h1 is None and self._heading:
                self.first_h1 = " ".join("".join(self._heading).split())
            self._heading = None
            self.parts.append("\n\n")
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title = ((self.title or "") + data).strip() or None
        elif not self._skip:
            text = re.sub(r"\s+", " ", data)
            self.parts.append(text)
            if self._heading is not None:
                self._heading.append(text)

    def text(self) -> str:
        joined = "".join(self.parts)
        joined = re.sub(r"[ \t]*\n[ \t]*", "\n", joined)
        return re.sub(r"\n{3,}", "\n\n", joined).strip()


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _markdown_title(text: str) -> str | None:
    m = re.search(r"^#\s+(.+?)\s*#*\s*$", text, re.MULTILINE)
    return m.group(1) if m else None


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as file:
        return b"\0" in file.read(_BINARY_PROBE_BYTES)


def load_file(path: Path, doc_id: str) -> Document:
    suffix = path.suffix.lower()
    title: str | None = None
    metadata: dict = {"format": suffix.lstrip(".") or "text"}
    if suffix == ".pdf":
        from pypdf import PdfReader

        # pages are read lazily from the file: everything is read before it (and the reader) close
        with open(path, "rb") as file, PdfReader(file) as reader:
            # form feeds between pages: the structure splitter treats them as page breaks
            text = "\f".join((page.extract_text() or "").strip("\f") for page in reader.pages)
            meta_title = reader.metadata.title if reader.metadata else None
            metadata["pages"] = len(reader.pages)
        title = meta_title.strip() if isinstance(meta_title, str) and meta_title.strip() else None
    elif suffix in {".html", ".htm"}:
        parser = _HtmlText()
        parser.feed(_read_text(path))
        parser.close()
        text = parser.text()
        title = parser.title or parser.first_h1
    else:
        if suffix not in {".txt", ".md", ".markdown"} and _looks_binary(path):  # no extension, or an unknown one
            raise ValueError("not a text file (it has NUL bytes)")
        text = _read_text(path)
        if suffix in {".md", ".markdown"}:
            title = _markdown_title(text)
    return Document(id=doc_id, text=text, title=title or path.stem, source=str(path), metadata=metadata)


def _candidates(paths: Iterable[str | Path]) -> Iterator[tuple[Path, str]]:
    """(file, stable id): files inside a folder are named by their path relative to it, a file given
    directly by its name."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
            skipped = Counter(p.suffix.lower() for p in files if p.suffix.lower() not in SUPPORTED_SUFFIXES)
            if skipped:  # said once per folder, never silently
                log.warning(
                    "%s: skipping %d files of unsupported types (%s)",
                    path,
                    sum(skipped.values()),
                    ", ".join(f"{suffix} x{n}" for suffix, n in skipped.most_common()),
                )
            for file in files:
                if file.suffix.lower() in SUPPORTED_SUFFIXES:
                    yield file, file.relative_to(path).as_posix()
        elif path.is_file():
            yield path, path.name
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")


def _hidden(relative: Path) -> bool:
    """.git/, .DS_Store and the like: tool state, not documents."""
    return any(part.startswith(".") for part in relative.parts)


def load_documents(paths: Iterable[str | Path]) -> Iterator[Document]:
    """Documents from files and folders (recursively). Files without an extension are read as text unless they
    are binary; other unsupported files in folders are skipped with one warning per folder; a file named
    directly with an unsupported suffix is read as text. Ids stay the same across runs."""
    seen: set[str] = set()
    for file, doc_id in _candidates(paths):
        if doc_id in seen:
            log.warning("skipping %s: another file already has the id %r", file, doc_id)
            continue
        seen.add(doc_id)
        try:
            doc = load_file(file, doc_id)
        except Exception as exc:  # one unreadable file should not stop a folder's ingestion
            log.warning("skipping %s: %s", file, exc)
            continue
        if not doc.text.strip():
            log.warning("skipping %s: no text", file)
            continue
        yield doc


def ingest_paths(
    store,
    collection: str,
    paths: Iterable[str | Path],
    show_progress: bool = True,
    screen: Callable[[Iterable[Document]], Iterable[Document]] | None = None,
    engine=None,
):
    """Load and ingest files into a collection of `store` (a DocumentStore); returns its IngestReport.
    `screen`, when given, sees the loaded documents first and yields those to ingest (the injection scan);
    `engine` (pipelines.ray_ingest.RayIngestEngine), when given, chunks and embeds them.

    The bar counts chunks embedded (the slow part), its total growing as documents are chunked; log lines
    are written above the bar instead of through it."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    with (
        logging_redirect_tqdm(),
        tqdm(total=0, unit="chunk", desc=f"ingest {collection}", disable=not show_progress) as bar,
    ):

        def planned(n: int) -> None:
            bar.total += n
            bar.refresh()

        documents = load_documents(paths)
        return store.ingest(
            collection,
            screen(documents) if screen else documents,
            progress=bar.update,
            planned=planned,
            engine=engine,
        )
