"""Small, deterministic paired-answer data for the router's training and replay tests.

Six made-up reports, each a little over 1,500 tokens (so the default policy's short-context rule does
not fire), with factoid questions (the cheap route suffices: recorded RAG and long answers score the
same) and summary questions (only the long route answers well), plus one RAG refusal per document.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = [
    ("harbour", "Kestrel Harbour", "the tide gauge", "copper"),
    ("orchard", "Wenlow Orchard", "the cider press", "oak"),
    ("observatory", "Marden Observatory", "the refractor", "brass"),
    ("railway", "Tolland Railway", "the signal box", "iron"),
    ("library", "Ashby Library", "the reading room", "walnut"),
    ("brewery", "Fenwick Brewery", "the malt kiln", "slate"),
]
FILLER = [
    "The committee met in the spring and reviewed the accounts of the previous season.",
    "Visitors were asked to sign the register kept beside the entrance.",
    "Repairs to the roof were postponed until the weather improved.",
    "The annual report notes that volunteers contributed most of the routine maintenance.",
    "A new noticeboard listed the opening hours and the names of the trustees.",
    "Several letters from residents praised the careful work of the staff.",
    "The budget for the coming year was approved without amendment.",
    "Records from earlier decades were moved to a dry storeroom upstairs.",
]


def document_text(index: int) -> str:
    slug, name, feature, material = TOPICS[index]
    rng = random.Random(index)
    parts = [f"{name}: annual report\n"]
    for section in range(1, 5):
        parts.append(f"\n{section}. Section {section} of the {slug} report\n\n")
        sentences = [rng.choice(FILLER) for _ in range(28)]
        if section == 2:
            sentences.insert(5, f"The keeper of {name} is Ada Quill{index}, appointed in {1900 + 7 * index}.")
            sentences.insert(9, f"{feature.capitalize()} at {name} is built of {material}, as described in Section 3.")
        if section == 3:
            sentences.insert(4, f"The {slug} received {120 + index} visitors on its open day.")
        parts.append(" ".join(sentences) + "\n")
    return "".join(parts)


def paired_rows(index: int) -> list[dict]:
    slug, name, feature, material = TOPICS[index]
    doc_id = f"report-{slug}"
    rows = [
        {
            "query": f"Who is the keeper of {name}?",
            "rag_score": 1.0,
            "lc_score": 1.0,
            "rag_pred": f"Ada Quill{index}",
            "lc_pred": f"Ada Quill{index}",
        },
        {
            "query": f"What is {feature} at {name} built of?",
            "rag_score": 1.0,
            "lc_score": 1.0,
            "rag_pred": material,
            "lc_pred": material,
        },
        {
            "query": f"How many visitors did the {slug} receive on its open day?",
            "rag_score": 1.0,
            "lc_score": 1.0 if index % 2 else 0.5,
            "rag_pred": str(120 + index),
            "lc_pred": str(120 + index),
        },
        {
            "query": f"Summarize the overall main idea of the {slug} report.",
            "rag_score": 0.2,
            "lc_score": 0.9,
            "rag_pred": "The report is about repairs.",
            "lc_pred": "A year of upkeep, visitors and accounts.",
        },
        {
            "query": "What is the report about overall, in general terms?",
            "rag_score": 0.1,
            "lc_score": 0.8,
            "rag_pred": "unanswerable",
            "lc_pred": "The running of the site over a year.",
        },
    ]
    for row in rows:
        row.update(doc_id=doc_id, task="synthetic", gt=row["lc_pred"])
    return rows


def write_paired_fixture(folder: Path, n_docs: int = 6) -> tuple[Path, Path]:
    """Writes folder/paired.jsonl and folder/docs/<doc_id>.txt; returns (paired file, docs folder)."""
    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n_docs):
        (docs / f"report-{TOPICS[i][0]}.txt").write_text(document_text(i), encoding="utf-8")
        rows.extend(paired_rows(i))
    paired = folder / "paired.jsonl"
    paired.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return paired, docs


def two_task_fixture(folder):
    """The paired fixture with two tasks (even and odd documents), for leave-one-task-out."""
    paired, _ = write_paired_fixture(folder)
    rows = [json.loads(line) for line in paired.read_text().splitlines()]
    for r in rows:
        r["task"] = "even" if sorted({x["doc_id"] for x in rows}).index(r["doc_id"]) % 2 == 0 else "odd"
    out = folder / "paired-two-tasks.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def two_corpora(folder):
    """Two paired files (corpora "alpha" and "beta") on different documents, each answered by two model families."""
    paired, docs = write_paired_fixture(folder)
    rows = [json.loads(line) for line in paired.read_text().splitlines()]
    doc_ids = sorted({r["doc_id"] for r in rows})
    out = []
    for name, part in (("alpha", doc_ids[:3]), ("beta", doc_ids[3:])):
        lines = [dict(r, model=("m1" if n % 2 else "m0")) for n, r in enumerate(rows) if r["doc_id"] in part]
        (folder / name).mkdir(exist_ok=True)
        path = folder / name / "paired.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
        out += ["--data", str(path), "--docs", str(docs)]
    return out
