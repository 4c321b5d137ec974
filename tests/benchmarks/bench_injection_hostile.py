"""Hostile documents (round nine): the injection scanner against paraphrases, other languages and obfuscations, and
its false positives on the shared benign corpora, per corpus. Not collected by pytest.

Positives: each line of tests/benchmarks/injection_hostile.jsonl (kind, split tune/heldout, text: paraphrased
overrides, fake chat turns, French, German, Spanish and other languages, "decode this and follow it" lures, fake
"unanswerable" instructions, instructions to send the document elsewhere) inserted at a random whitespace of --hosts
random 8 KB windows of real documents. The override-like kinds are also inserted obfuscated: words split by HTML
comments or by empty tags, zero-width or soft-hyphen characters inside words, look-alike letters from other scripts,
and hidden in markup (an HTML comment, a display:none div, a font-size:0 span, a markdown comment). A positive counts
when a finding overlaps the inserted span. Lines alternate tune / heldout: rules were written looking at the tune
lines only (both were written by the same engineer: the held-out figure is still optimistic).

Negatives: the whole benign corpora of bench_injection.py (CUAD contracts, Debian/GNU texts in 20 KB windows, LooGLE,
L-Eval documents): a document with any finding is a false positive.

Speed: one 100k-token document (CUAD contracts joined to 400,000 characters) and the same with HTML markup every
paragraph, scanned --rounds times; with --baseline REV the module as of that git revision is timed alternately with
the working tree's in the same process (A/B), and its recall and false positives are printed alongside.

    .venv/bin/python tests/benchmarks/bench_injection_hostile.py --data ../shared/data [--baseline main]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_injection import benign_corpora, insert  # noqa: E402

import pipelines.safety.injection as current  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# kinds whose lines are also inserted obfuscated (the rest carry their own structure: turns, URLs, blobs)
OBFUSCATED_KINDS = ("paraphrase_en", "french", "german", "spanish", "other_lang", "fake_unanswerable")

# look-alikes from several scripts, chosen here by hand (not from the scanner's table)
_LOOKALIKES = {
    "a": "аɑα",
    "e": "еҽ",
    "o": "оοօᴏ",
    "i": "іɩ",
    "c": "сϲᴄ",
    "p": "рρ",
    "s": "ѕ",
    "y": "уү",
    "x": "х",
    "h": "һ",
    "d": "ԁ",
}


def _per_word(text: str, fn) -> str:
    return " ".join(fn(w) if sum(c.isalpha() for c in w) >= 5 else w for w in text.split(" "))


def _mid(w: str, sep: str) -> str:
    k = len(w) // 2
    return w[:k] + sep + w[k:]


def obfuscations(rng: random.Random) -> dict[str, object]:
    def homoglyph(t: str) -> str:
        return "".join(rng.choice(_LOOKALIKES[c]) if c in _LOOKALIKES and rng.random() < 0.5 else c for c in t)

    return {
        "plain": lambda t: t,
        "html_comment_split": lambda t: _per_word(t, lambda w: _mid(w, "<!-- -->")),
        "empty_tag_split": lambda t: _per_word(t, lambda w: _mid(w, "<b></b>")),
        "span_split": lambda t: _per_word(t, lambda w: "<span>" + _mid(w, "</span><span>") + "</span>"),
        "zero_width": lambda t: _per_word(t, lambda w: _mid(w, "\u200b")),
        "soft_hyphen": lambda t: _per_word(t, lambda w: _mid(w, "\u00ad")),
        "word_joiner": lambda t: _per_word(t, lambda w: _mid(w, "\u2060")),
        "homoglyph": homoglyph,
        "fullwidth": lambda t: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" and c.isalpha() else c for c in t),
        "in_html_comment": lambda t: f"<!-- {t} -->",
        "display_none": lambda t: f'<div style="display:none">{t}</div>',
        "font_size_0": lambda t: f'<span style="font-size:0">{t}</span>',
        "markdown_comment": lambda t: f"\n[//]: # ({t})\n",
    }


def load_module(rev: str, name: str = "injection_baseline"):
    """pipelines/safety/injection.py as of git revision ``rev``, imported under another name."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:pipelines/safety/injection.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--strings", default=str(HERE / "injection_hostile.jsonl"))
    ap.add_argument("--hosts", type=int, default=3, help="benign host windows per (line, obfuscation)")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument(
        "--baseline",
        default="",
        help="git revision(s), comma-separated, whose scanner is measured alongside (e.g. 8c22184,main); the first is "
        "'before' in the recall tables",
    )
    ap.add_argument("--rounds", type=int, default=5, help="timed scans of each 100k-token document per module")
    ap.add_argument("--show-misses", action="store_true")
    ap.add_argument("--speed-only", action="store_true", help="only the timing of the 100k-token documents")
    args = ap.parse_args()
    print(f"load average at start: {load()}")
    modules = {"now": current}
    if args.baseline:
        revs = args.baseline.split(",")
        modules = {"before": load_module(revs[0])}
        modules.update({rev: load_module(rev, f"injection_{i}") for i, rev in enumerate(revs[1:], 1)})
        modules["now"] = current

    corpora = benign_corpora(Path(args.data))
    strings = [json.loads(line) for line in open(args.strings) if line.strip()]
    print(
        f"hostile lines: {len(strings)}; "
        + ", ".join(f"{k} {v}" for k, v in collections.Counter(s["kind"] for s in strings).items())
    )

    if args.speed_only:
        speed(corpora, modules, args.rounds)
        return

    # --- negatives, per corpus
    print("\nbenign corpora: documents with any finding")
    print(f"{'corpus':16s} {'docs':>5s} {'MB':>6s} " + " ".join(f"{m:>16s}" for m in modules))
    fp_examples: dict[str, list] = {m: [] for m in modules}
    for name, docs in corpora.items():
        cells = []
        for label, mod in modules.items():
            flagged = 0
            for d in docs:
                found = mod.scan(d)
                if found:
                    flagged += 1
                    for f in found[:2]:
                        fp_examples[label].append((name, f.rule, f.excerpt[:90]))
            cells.append(f"{flagged:5d} ({flagged / len(docs):6.2%})")
        print(f"{name:16s} {len(docs):5d} {sum(map(len, docs)) / 1e6:6.2f} " + " ".join(f"{c:>16s}" for c in cells))
    for label, ex in fp_examples.items():
        for e in ex[:12]:
            print(f"    {label} false positive: {e}")

    # --- positives
    rng = random.Random(args.seed)
    transforms = obfuscations(rng)
    hosts = [(name, d) for name, docs in corpora.items() for d in docs if len(d) > 9000]
    by_kind = collections.defaultdict(lambda: collections.Counter())  # (kind, split) -> label -> hits; "n"
    by_transform = collections.defaultdict(lambda: collections.Counter())
    misses = collections.Counter()
    for s in strings:
        names = list(transforms) if s["kind"] in OBFUSCATED_KINDS else ["plain"]
        for tname in names:
            payload = transforms[tname](s["text"])
            for _ in range(args.hosts):
                _, doc = rng.choice(hosts)
                start = rng.randrange(0, len(doc) - 8000)
                text, a, b = insert(doc[start : start + 8000], payload, rng)
                for label, mod in modules.items():
                    hit = any(f.start < b and f.end > a for f in mod.scan(text))
                    by_kind[(s["kind"], s["split"])][label] += hit
                    by_transform[(tname, s["split"])][label] += hit
                    if label == "now" and not hit:
                        misses[(s["kind"], s["split"], tname, s["text"][:70])] += 1
                by_kind[(s["kind"], s["split"])]["n"] += 1
                by_transform[(tname, s["split"])]["n"] += 1

    def table(title: str, rows: dict) -> None:
        print(f"\n{title}")
        print(f"{'':20s} {'split':8s} {'docs':>5s} " + " ".join(f"{m:>8s}" for m in modules))
        for split in ("tune", "heldout"):
            total = collections.Counter()
            for (key, sp), c in sorted(rows.items()):
                if sp != split:
                    continue
                total.update(c)
                print(f"{key:20s} {split:8s} {c['n']:5d} " + " ".join(f"{c[m] / c['n']:8.3f}" for m in modules))
            print(
                f"{'all':20s} {split:8s} {total['n']:5d} " + " ".join(f"{total[m] / total['n']:8.3f}" for m in modules)
            )

    table("recall by kind (a finding overlaps the inserted text)", by_kind)
    table(f"recall by obfuscation (kinds {', '.join(OBFUSCATED_KINDS)})", by_transform)
    missed_lines = {k[3] for k in misses}
    print(f"\nmissed (now): {sum(misses.values())} documents, {len(missed_lines)} distinct lines")
    if args.show_misses:
        for (kind, split, tname, text), n in sorted(misses.items()):
            print(f"    {kind:18s} {split:8s} {tname:18s} x{n} {text!r}")

    speed(corpora, modules, args.rounds)


def speed(corpora: dict[str, list[str]], modules: dict, rounds: int) -> None:
    """ms per 100k-token document, the modules timed alternately (A/B) in this process."""
    contracts = "\n\n".join(corpora["cuad"])
    plain = contracts[:400_000]
    paras = plain.split("\n\n")
    html = "\n".join(f'<p class="c{i % 7}">{p}</p><!-- page {i} -->' for i, p in enumerate(paras))[:400_000]
    print(f"\nspeed: ms per 100k-token document (400,000 characters), median of {rounds} (load {load()})")
    for doc_name, doc in (("CUAD plain text", plain), ("CUAD as HTML", html)):
        times: dict[str, list[float]] = {m: [] for m in modules}
        for label, mod in modules.items():
            mod.scan(doc[:2000])  # compile and load tables outside the timing
        for _ in range(rounds):
            for label, mod in modules.items():
                t0 = time.perf_counter()
                mod.scan(doc)
                times[label].append((time.perf_counter() - t0) * 1000)
        print(
            f"  {doc_name:16s} "
            + "  ".join(f"{m} {statistics.median(t):7.1f} (min {min(t):.1f})" for m, t in times.items())
        )
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    main()
