"""Idle RSS of a ready gateway, per policy and embedding backend, and which heavy libraries it imported.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/bench_idle_rss.py [--backends torch onnx onnx-int8] \
        [--policies hosted default] [--smaps 12]

Each cell is its own process: the app (gateway.server.app.create_app) under a real uvicorn on port 0, waited for
until its readiness probe would say ready (every model the policy needs loaded, the store open, litellm's prices
warm), then a full collection, and /proc/self/smaps_rollup read: RSS, PSS (shared pages divided among the processes
that map them), USS (private pages), anonymous and file-backed (mapped files: libraries, the mmap'd GGUF weights,
which the kernel can drop and re-read). For the `default` policy it then sends one routed request (the harbour
sample's three documents attached, a question, 16 tokens of answer: a first pass over the new documents, the
classifier, SmolLM2, the verifier; the routes' timeouts lifted for it) and reads them again --settle seconds apart; --smaps N lists the N
mappings with the most RSS after it (all anonymous memory is one line: the heap and the libraries' allocations).
Policies: `default` (the shipped
policies/default.yaml: both routes on the in-process SmolLM2, the classifier and the verifier) and `hosted` (the
pass-through benchmark's: both routes on an OpenAI-compatible upstream, no classifier, the default verifier).
The ONNX exports come from the shared model cache (pipelines.embedding.default_cache_dir), as a gateway finds them
after its first start: a cell that has to export first shows it in its ready time, not in its RSS (a child process).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HEAVY = (
    "torch",
    "sentence_transformers",
    "transformers",
    "onnxruntime",
    "tokenizers",
    "llama_cpp",
    "litellm",
    "lancedb",
    "pyarrow",
    "pandas",
    "sklearn",
    "skops",
    "scipy",
    "numpy",
)


def memory() -> dict[str, int]:
    """MB of RSS, PSS, USS, anonymous and file-backed pages of this process (smaps_rollup)."""
    kb: dict[str, int] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        kb[name] = int(value.split()[0])
    return {
        "rss": round(kb["Rss"] / 1024),
        "pss": round(kb["Pss"] / 1024),
        "uss": round((kb["Private_Clean"] + kb["Private_Dirty"]) / 1024),
        "anon": round(kb["Anonymous"] / 1024),
        "file": round((kb["Rss"] - kb["Anonymous"]) / 1024),
    }


def top_mappings(n: int) -> list[str]:
    """The n mappings (by file; anonymous ones together) with the most RSS: 'MB rss / MB pss  name'."""
    import collections
    import re

    rss: collections.Counter[str] = collections.Counter()
    pss: collections.Counter[str] = collections.Counter()
    name = "[anonymous]"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) > 5 else ""
            name = path if path.startswith("/") else "[anonymous]"  # [heap], [stack] and unnamed: anonymous
        elif line.startswith(("Rss:", "Pss:")):
            (rss if line.startswith("Rss:") else pss)[name] += int(line.split()[1])
    return [
        f"{rss[k] / 1024:7.1f} rss {pss[k] / 1024:7.1f} pss  {k.replace(sys.prefix, '$VENV')}"
        for k, _ in rss.most_common(n)
    ]


def routed_request(base: str) -> str:
    """One routed request about new attached documents; returns its route (waits for the background ingestion)."""
    import httpx

    from pipelines.samples import sample_path

    documents = [{"id": p.stem, "text": p.read_text()} for p in sorted(sample_path().glob("*.md"))]
    body = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "Who maintains the fenders at Berth 7?"}],
        "max_tokens": 16,
        "temperature": 0,
        "selfroute": {"documents": documents},
    }
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=1800)
    response.raise_for_status()
    return response.headers.get("x-selfroute-route", "?")


def cell(policy_name: str, backend: str, data_dir: str, smaps: int = 0, settle: tuple = (20.0,)) -> dict:
    from gateway.server.app import create_app
    from gateway.settings import Settings
    from policies.loader import load_policy
    from tests.support.policies import Whole, fake_route, make_policy
    from tests.support.servers import serve_app

    base = "http://127.0.0.1:9"  # never called: the cell only starts the gateway
    if policy_name == "default":
        policy, _ = load_policy(ROOT / "policies" / "default.yaml")
        rag = policy.rag.model_copy(update={"embedding_backend": backend})
        # SmolLM2 reading 1,200 tokens of passages takes minutes on loaded cores: no timeout for the one request
        cheap, long = (c.model_copy(update={"timeout": 1800}) for c in (policy.cheap, policy.long))
        policy = policy.model_copy(update={"rag": rag, "cheap": cheap, "long": long})
    else:
        policy = make_policy(
            base,
            name="bench",
            cheap=fake_route(base, "bench-cheap"),
            long=fake_route(base, "bench-long"),
            routing=Whole(classifier=None),
            rag={"embedding_backend": backend},
        )
    started = time.perf_counter()
    app = create_app(Settings(data_dir=Path(data_dir)), policy=policy)
    after: dict = {}
    with serve_app(app) as base:
        ready = time.perf_counter() - started
        time.sleep(1.0)  # the gc-freeze thread
        gc.collect()
        idle = memory()
        imported = [m for m in HEAVY if m in sys.modules]
        if policy_name == "default":
            route = routed_request(base)
            # the background ingestion of the documents' other chunks (a few dozen) may still run at the first
            # reading: readings SETTLE seconds apart after the answer
            readings = []
            for seconds in settle:
                time.sleep(seconds)
                gc.collect()
                readings.append({"after_s": sum(settle[: len(readings) + 1]), **memory()})
            # diagnosis: what of it is memory freed but kept by glibc's allocator (returned by malloc_trim), and what
            # pyarrow's own pool holds
            import ctypes

            import pyarrow

            ctypes.CDLL("libc.so.6").malloc_trim(0)
            pool = pyarrow.default_memory_pool()
            readings.append(
                {
                    "after_s": sum(settle),
                    "note": f"after malloc_trim(0); pyarrow {pool.backend_name} pool holds "
                    f"{pool.bytes_allocated() / 2**20:.0f} MB",
                    **memory(),
                }
            )
            after = {
                **readings[-1],
                "readings": readings,
                "route": route,
                "imported": [m for m in HEAVY if m in sys.modules and m not in imported],
                "top": top_mappings(smaps),
            }
    return {
        "policy": policy_name,
        "backend": backend,
        "ready_s": round(ready, 1),
        **idle,
        "imported": imported,
        "after": after,
    }


def figures(row: dict) -> str:
    return (
        f"RSS {row['rss']:4d} MB (anonymous {row['anon']:4d}, file-backed {row['file']:4d})  "
        f"PSS {row['pss']:4d}  USS {row['uss']:4d}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["torch", "onnx", "onnx-int8"])
    parser.add_argument("--policies", nargs="+", default=["hosted", "default"])
    parser.add_argument("--smaps", type=int, default=0, help="list the N mappings with the most RSS")
    parser.add_argument(
        "--settle", type=float, nargs="+", default=[20.0], help="seconds between the readings after the request"
    )
    parser.add_argument("--cell", nargs=3, help=argparse.SUPPRESS)  # policy backend data_dir: one child process
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if args.cell:
        print(json.dumps(cell(*args.cell, smaps=args.smaps, settle=tuple(args.settle))))
        return 0
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}, cores {len(os.sched_getaffinity(0))}")
    parent = Path(tempfile.mkdtemp(prefix="selfroute-rss-"))
    for policy_name in args.policies:
        for backend in args.backends:
            data_dir = parent / f"{policy_name}-{backend}"
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--cell",
                    policy_name,
                    backend,
                    str(data_dir),
                    "--smaps",
                    str(args.smaps),
                    "--settle",
                ]
                + [str(x) for x in args.settle],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            if out.returncode != 0:
                print(f"{policy_name} {backend}: failed\n{out.stderr[-3000:]}")
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{row['policy']:8s} {row['backend']:10s} ready ({row['ready_s']:5.1f} s): {figures(row)}  "
                f"imported: {' '.join(row['imported'])}"
            )
            after = row["after"]
            if after:
                for reading in after["readings"]:
                    print(
                        f"{'':19s} {reading['after_s']:4.0f} s after one routed request ({after['route']}): "
                        f"{figures(reading)} {reading.get('note', '')}"
                    )
                print(f"{'':19s} imported since readiness: {' '.join(after['imported']) or '-'}")
                for line in after["top"]:
                    print(f"{'':23s}{line}")
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
