"""Convert L-Eval's paired RAG-vs-long-context predictions into the replay's paired format.

Input: a folder holding paired_rag_vs_lc.jsonl and LEval-data/ (see shared/data/README.md); each
paired row names its document as a 0-based line (`doc`) in the task's L-Eval file.
Output: OUT/paired.jsonl (doc_id, query, rag_score, lc_score, rag_pred, lc_pred, task, gt, group,
metric) and OUT/docs/<doc_id>.txt, the format `selfroute eval replay` and `selfroute train` read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MODEL_FAMILY = "gpt-3.5-turbo"

PAIRED_FILE = "paired_rag_vs_lc.jsonl"
DATA_DIR = "LEval-data"


@dataclass
class PrepareReport:
    questions: int
    documents: int
    query_mismatches: int  # paired queries that differ from the L-Eval instruction they point at
    out_dir: Path


def _task_files(leval_dir: Path) -> dict[str, Path]:
    return {path.stem: path for path in sorted((leval_dir / DATA_DIR).glob("*/*.jsonl"))}


def doc_id_for(task: str, doc: int) -> str:
    return f"{task}-{int(doc):03d}"


def prepare_leval(leval_dir: str | Path, out_dir: str | Path) -> PrepareReport:
    leval_dir, out_dir = Path(leval_dir), Path(out_dir)
    paired = leval_dir / PAIRED_FILE
    if not paired.is_file():
        raise FileNotFoundError(f"{paired}: not found (expected L-Eval's paired predictions here)")
    files = _task_files(leval_dir)
    docs_dir = out_dir / "docs"
    docs_dir.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[dict]] = {}
    written: set[str] = set()
    mismatches = 0
    rows = []
    with paired.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            task = row["task"]
            if task not in files:
                raise ValueError(f"{paired}:{number}: no L-Eval file for task {task!r} under {leval_dir / DATA_DIR}")
            if task not in lines:
                with files[task].open(encoding="utf-8") as task_file:
                    lines[task] = [json.loads(x) for x in task_file if x.strip()]
            source = lines[task][int(row["doc"])]
            doc_id = doc_id_for(task, row["doc"])
            if doc_id not in written:
                (docs_dir / f"{doc_id}.txt").write_text(source["input"], encoding="utf-8")
                written.add(doc_id)
            instructions = source.get("instructions") or []
            index = row.get("question")
            if index is None or index >= len(instructions) or instructions[index].strip() != row["query"].strip():
                mismatches += 1
            rows.append(
                {
                    "doc_id": doc_id,
                    "query": row["query"],
                    "rag_score": float(row["rag_score"]),
                    "lc_score": float(row["lc_score"]),
                    "rag_pred": row.get("rag_pred"),
                    "lc_pred": row.get("lc_pred"),
                    "task": task,
                    "gt": row.get("gt"),
                    "group": doc_id,
                    "metric": row.get("metric"),
                    # both routes' answers come from one model family (gpt-3.5-turbo-0613 with retrieval,
                    # gpt-3.5-turbo-16k-0613 with the whole document): the unit of --protocol model
                    "model": MODEL_FAMILY,
                }
            )
    with (out_dir / "paired.jsonl").open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    if mismatches:
        log.warning("%d paired queries differ from the L-Eval instruction they index (kept as recorded)", mismatches)
    return PrepareReport(len(rows), len(written), mismatches, out_dir)
