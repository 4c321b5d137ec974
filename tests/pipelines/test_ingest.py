import zlib
from pathlib import Path

import pytest

from pipelines.ingest import load_documents

MANUAL = Path(__file__).parent / "fixtures" / "manual.md"


def make_pdf(pages: list[str], title: str = "Tiny Report") -> bytes:
    """A minimal valid PDF with one text object per page (Helvetica), built by hand."""
    objects: list[bytes] = []
    n_pages = len(pages)
    page_ids = [4 + 2 * i for i in range(n_pages)]
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(
        b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % p for p in page_ids) + b"] /Count %d >>" % n_pages
    )
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        lines = text.split("\n")
        ops = (
            b"BT /F1 12 Tf 72 720 Td 14 TL "
            + b" ".join(
                b"(" + line.encode("latin-1").replace(b"(", b"\\(").replace(b")", b"\\)") + b") Tj T*" for line in lines
            )
            + b" ET"
        )
        stream = zlib.compress(ops)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>"
            % (page_ids[i] + 1)
        )
        objects.append(b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Title (" + title.encode("latin-1") + b") >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        len(objects),
        xref,
    )
    return bytes(out)


HTML = """<!doctype html><html><head><title>Widget Guide</title><style>p {color: red}</style>
<script>var secret = "do not index";</script></head>
<body><h1>Widgets</h1><p>Widgets are small &amp; useful.</p>
<h2>2.1 Care</h2><p>Oil the widget monthly.</p><ul><li>Keep dry</li><li>Keep cool</li></ul></body></html>"""


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "notes.txt").write_text("Plain notes.\n\nSecond paragraph.", encoding="utf-8")
    (root / "sub" / "manual.md").write_text(MANUAL.read_text(), encoding="utf-8")
    (root / "sub" / "deeper" / "guide.html").write_text(HTML, encoding="utf-8")
    (root / "sub" / "report.pdf").write_bytes(make_pdf(["1. Summary", "Revenue grew 12 percent.\nCosts fell."]))
    (root / "ignored.bin").write_bytes(b"\x00\x01")
    (root / "empty.txt").write_text("   ", encoding="utf-8")
    return root


def test_folder_loaded_recursively_with_stable_ids(corpus):
    docs = {d.id: d for d in load_documents([corpus])}
    assert sorted(docs) == ["notes.txt", "sub/deeper/guide.html", "sub/manual.md", "sub/report.pdf"]
    assert docs["notes.txt"].title == "notes"
    assert docs["notes.txt"].source == str(corpus / "notes.txt")
    assert docs["sub/manual.md"].title == "Harbor Pump Operations Manual"
    again = {d.id: d for d in load_documents([corpus])}
    assert {k: v.text for k, v in again.items()} == {k: v.text for k, v in docs.items()}


def test_files_without_an_extension_are_text_and_skipped_files_are_reported(corpus, caplog):
    (corpus / "README").write_text("Read me first: valves open clockwise.", encoding="utf-8")
    (corpus / "blob").write_bytes(b"ELF\x00\x01\x02")
    (corpus / ".git").mkdir()
    (corpus / ".git" / "HEAD").write_text("ref: refs/heads/main")
    with caplog.at_level("WARNING", logger="pipelines.ingest"):
        docs = {d.id: d for d in load_documents([corpus])}
    assert docs["README"].text == "Read me first: valves open clockwise." and docs["README"].title == "README"
    assert docs["README"].metadata["format"] == "text"
    assert "blob" not in docs and ".git/HEAD" not in docs
    messages = [r.getMessage() for r in caplog.records]
    assert any("skipping 1 files of unsupported types (.bin x1)" in m for m in messages), messages
    assert any("blob" in m and "not a text file" in m for m in messages), messages


def test_html_text_and_headings(corpus):
    (doc,) = load_documents([corpus / "sub" / "deeper" / "guide.html"])
    assert doc.id == "guide.html" and doc.title == "Widget Guide"
    assert "Widgets are small & useful." in doc.text
    assert "## 2.1 Care" in doc.text and "Keep dry" in doc.text
    assert "secret" not in doc.text and "color" not in doc.text


def test_pdf_pages_joined_with_form_feeds(corpus):
    (doc,) = load_documents([corpus / "sub" / "report.pdf"])
    assert doc.title == "Tiny Report"
    assert doc.metadata["pages"] == 2
    first, second = doc.text.split("\f")
    assert "1. Summary" in first
    assert "Revenue grew 12 percent." in second


def test_pdf_file_and_reader_are_closed_after_loading(corpus, monkeypatch):
    import pypdf

    readers = []

    class RecordingReader(pypdf.PdfReader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.closed = False
            readers.append(self)

        def close(self):
            self.closed = True
            super().close()

    monkeypatch.setattr(pypdf, "PdfReader", RecordingReader)
    (doc,) = load_documents([corpus / "sub" / "report.pdf"])
    assert doc.metadata["pages"] == 2 and "Revenue grew 12 percent." in doc.text
    (reader,) = readers
    assert reader.closed and reader.stream.closed


def test_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(load_documents([tmp_path / "nope"]))
