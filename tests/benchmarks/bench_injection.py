"""Document-injection scanner (pipelines.safety.injection): precision, recall per kind, false positives, speed.

Not collected by pytest. Labelled set:

* negatives: real benign text from --data: CUAD contracts (whole files), corpus_structured_docs (Debian policy,
  constitution, GNU standards, licences) cut into 20 KB windows, LooGLE long documents, L-Eval documents (deduplicated);
* positives: each string of tests/benchmarks/injection_strings.jsonl (kind + source per line) inserted at a random
  whitespace position of --hosts random 8 KB windows of those benign documents.

A positive counts as detected when a finding overlaps the inserted span; a finding elsewhere in a positive host, or
any finding in a negative, is a false positive. Strip check: after strip(), no finding left and the host text outside
the inserted span unchanged (whitespace aside).

    .venv/bin/python tests/benchmarks/bench_injection.py --data ../shared/data

Second set, written by others (--public, default tests/benchmarks/injection_public.jsonl): attack strings from
published benchmarks and public collections (BIPIA, InjecAgent, Greshake et al., jailbreak prompts, public
red-team configs; each line names its source), in styles: exfiltration, tool_call, persona, task_hijack, chinese,
obfuscated (others' text, obfuscated by us after Hackett et al. 2025's character injection). Each line is marked
`tune` (rules may have been written looking at it) or `heldout` (never looked at while writing rules): report
the held-out figure. Each is inserted into --public-hosts random CUAD contracts (whole files). Reported per style and
split: recall, and for strip, how many detected documents still hold a whole sentence of the payload afterwards
(a working instruction left behind).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.safety.injection import scan, strip  # noqa: E402

HERE = Path(__file__).resolve().parent


def benign_corpora(data: Path) -> dict[str, list[str]]:
    corpora: dict[str, list[str]] = {}
    corpora["cuad"] = [
        Path(f).read_text(errors="replace")
        for f in sorted(glob.glob(str(data / "cuad/CUAD_v1/full_contract_txt/*.txt")))
    ]
    windows = []
    for f in sorted(glob.glob(str(data / "corpus_structured_docs/*/*"))):
        if f.endswith("copyright"):
            continue
        text = Path(f).read_text(errors="replace")
        windows += [text[i : i + 20_000] for i in range(0, len(text), 20_000)]
    corpora["structured_docs"] = windows
    seen, loogle = set(), []
    for f in sorted(glob.glob(str(data / "loogle/LooGLE-testdata/*.jsonl"))):
        for line in open(f):
            doc = json.loads(line)["input"]
            if doc[:200] not in seen:
                seen.add(doc[:200])
                loogle.append(doc)
    corpora["loogle"] = loogle
    seen, leval = set(), []
    for f in sorted(glob.glob(str(data / "leval/LEval-data/*/*.jsonl"))):
        for line in open(f):
            doc = json.loads(line)["input"]
            if doc[:200] not in seen:
                seen.add(doc[:200])
                leval.append(doc)
    corpora["leval"] = leval
    return corpora


def insert(host: str, payload: str, rng: random.Random) -> tuple[str, int, int]:
    spaces = [m.start() for m in re.finditer(r"\s", host)] or [len(host)]
    at = rng.choice(spaces)
    piece = " " + payload + " "
    return host[:at] + piece + host[at:], at + 1, at + 1 + len(payload)


_SENTENCE = re.compile(r"(?<=[.!?。！？])\s*")


def instruction_left(cleaned: str, payload: str) -> bool:
    """Whether strip() left a whole sentence of the payload (3+ words, or 6+ CJK characters) in the text."""
    for sentence in _SENTENCE.split(payload):
        sentence = sentence.strip()
        words = len(sentence.split())
        cjk = sum(1 for c in sentence if "\u3400" <= c <= "\u9fff")
        if (words >= 3 or cjk >= 6) and sentence in cleaned:
            return True
    return False


def public_set(path: str, contracts: list[str], hosts: int, rng: random.Random) -> None:
    """Recall per style and split on strings written by others, inserted into whole CUAD contracts."""
    strings = [json.loads(line) for line in open(path) if line.strip()]
    print(
        f"\nstrings written by others ({path}): {len(strings)}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(collections.Counter(s["kind"] for s in strings).items()))
    )
    table = collections.defaultdict(lambda: [0, 0, 0, 0])  # (kind, split) -> hit, total, detected, instruction left
    misses = []
    for s in strings:
        for _ in range(hosts):
            host = rng.choice(contracts)
            text, a, b = insert(host, s["text"], rng)
            found = scan(text)
            row = table[(s["kind"], s["split"])]
            row[1] += 1
            if any(f.start < b and f.end > a for f in found):
                row[0] += 1
                row[2] += 1
                row[3] += instruction_left(strip(text, found), s["text"])
            elif (s["split"], s["text"][:80]) not in misses:
                misses.append((s["split"], s["text"][:80]))
    print(f"{'style':14s} {'split':8s} {'recall':>14s} {'strip left an instruction':>27s}")
    for split in ("tune", "heldout"):
        hit = total = left = detected = 0
        for (kind, sp), (h, t, d, l) in sorted(table.items()):
            if sp != split:
                continue
            hit, total, detected, left = hit + h, total + t, detected + d, left + l
            print(f"{kind:14s} {split:8s} {h:5d}/{t:<4d} {h / t:5.1%} {l:12d} of {d}")
        print(f"{'all':14s} {split:8s} {hit:5d}/{total:<4d} {hit / total:5.1%} {left:12d} of {detected}")
    if misses:
        print("missed strings (split, opening):")
        for m in misses:
            print("   ", m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--strings", default=str(HERE / "injection_strings.jsonl"))
    ap.add_argument("--hosts", type=int, default=5, help="benign host windows per injection string")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--public",
        default=str(HERE / "injection_public.jsonl"),
        help="attack strings written by others (with kind, split, source); '' to skip",
    )
    ap.add_argument("--public-hosts", type=int, default=5, help="CUAD contracts per string of --public")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    data = Path(args.data)

    corpora = benign_corpora(data)
    strings = [json.loads(line) for line in open(args.strings) if line.strip()]
    print(
        f"injection strings: {len(strings)} in {len(set(s['kind'] for s in strings))} kinds; "
        + ", ".join(f"{k} {v}" for k, v in collections.Counter(s["kind"] for s in strings).items())
    )

    # --- negatives: false positives per corpus, and throughput
    print("\nbenign corpora (negatives)")
    print(
        f"{'corpus':16s} {'docs':>5s} {'MB':>6s} {'docs flagged':>13s} {'findings':>9s} {'per 100KB':>10s} {'ms/100KB':>9s}"
    )
    all_fp_rules = collections.Counter()
    neg_flagged = neg_total = 0
    total_chars = total_time = 0.0
    examples = []
    for name, docs in corpora.items():
        flagged = findings = 0
        chars = sum(len(d) for d in docs)
        t0 = time.perf_counter()
        results = [scan(d) for d in docs]
        dt = time.perf_counter() - t0
        for d, res in zip(docs, results):
            if res:
                flagged += 1
                findings += len(res)
                for f in res:
                    all_fp_rules[f.rule] += 1
                    if len(examples) < 15:
                        examples.append((name, f.rule, f.excerpt[:100]))
        neg_flagged += flagged
        neg_total += len(docs)
        total_chars += chars
        total_time += dt
        print(
            f"{name:16s} {len(docs):5d} {chars / 1e6:6.2f} {flagged:6d} ({flagged / len(docs):5.1%}) {findings:9d} "
            f"{findings / (chars / 1e5):10.3f} {dt * 1000 / (chars / 1e5):9.2f}"
        )
    print(
        f"{'all':16s} {neg_total:5d} {total_chars / 1e6:6.2f} {neg_flagged:6d} ({neg_flagged / neg_total:5.1%})"
        f" {'':9s} {'':10s} {total_time * 1000 / (total_chars / 1e5):9.2f}"
    )
    if all_fp_rules:
        print("false-positive rules:", dict(all_fp_rules))
        for e in examples:
            print("   ", e)
    print(
        f"throughput: {total_chars / 1e6 / total_time:.2f} MB/s ({total_time * 1000 / (total_chars / 1e5):.2f} ms per 100 KB)"
    )

    # --- positives
    host_pool = [(name, d) for name, docs in corpora.items() for d in docs if len(d) > 2000]
    per_kind = collections.defaultdict(lambda: [0, 0])
    rules_by_kind = collections.defaultdict(collections.Counter)
    misses = []
    strip_clean = strip_total = strip_no_finding = strip_host_intact = 0
    pos_docs_with_extra_fp = 0
    n_pos = 0
    for s in strings:
        for _ in range(args.hosts):
            name, doc = rng.choice(host_pool)
            start = rng.randrange(0, max(1, len(doc) - 8000))
            host = doc[start : start + 8000]
            text, a, b = insert(host, s["text"], rng)
            found = scan(text)
            hit = [f for f in found if f.start < b and f.end > a]
            extra = [f for f in found if not (f.start < b and f.end > a)]
            n_pos += 1
            per_kind[s["kind"]][1] += 1
            if hit:
                per_kind[s["kind"]][0] += 1
                for r in {f.rule for f in hit}:
                    rules_by_kind[s["kind"]][r] += 1
                strip_total += 1
                cleaned = strip(text, found)
                no_left = not scan(cleaned)
                strip_no_finding += no_left
                host_intact = re.sub(r"\s+", "", cleaned) == re.sub(r"\s+", "", host)
                strip_host_intact += host_intact
                strip_clean += no_left and host_intact
            elif s["text"] not in [m[1] for m in misses]:
                misses.append((s["kind"], s["text"][:90]))
            if extra:
                pos_docs_with_extra_fp += 1
    tp = sum(v[0] for v in per_kind.values())
    print(f"\npositives: {n_pos} documents ({len(strings)} strings x {args.hosts} hosts)")
    print(f"{'kind':14s} {'recall':>8s}  rules that fired")
    for kind, (hit, total) in sorted(per_kind.items()):
        top = ", ".join(f"{r} {c}" for r, c in rules_by_kind[kind].most_common(4))
        print(f"{kind:14s} {hit / total:8.3f}  {top}")
    recall = tp / n_pos
    precision = tp / (tp + neg_flagged) if tp + neg_flagged else 0.0
    print(
        f"overall recall {recall:.3f} ({tp}/{n_pos}); document-level precision {precision:.3f} "
        f"({tp} detected positives vs {neg_flagged} flagged benign documents out of {neg_total})"
    )
    print(f"positive hosts with a finding outside the inserted span: {pos_docs_with_extra_fp}")
    print(
        f"strip (of {strip_total} detected positives): no finding left {strip_no_finding}, host text exactly "
        f"restored {strip_host_intact} (the rest: a sentence tail of host text also removed, or an unflagged "
        f"follow-on sentence of the payload left), both {strip_clean}"
    )
    if misses:
        print("missed strings:")
        for m in misses:
            print("   ", m)
    strip_left = 0
    for s in strings:  # the same check as for the public set, on our own strings (one host each)
        name, doc = rng.choice(host_pool)
        text, a, b = insert(doc[:8000], s["text"], rng)
        found = scan(text)
        strip_left += bool(found) and instruction_left(strip(text, found), s["text"])
    print(f"our strings, strip left a whole payload sentence: {strip_left} of {len(strings)}")
    if args.public:
        public_set(args.public, corpora["cuad"], args.public_hosts, rng)


if __name__ == "__main__":
    main()
