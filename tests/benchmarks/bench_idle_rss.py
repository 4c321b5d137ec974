"""Idle RSS of a ready gateway, per policy and embedding backend, and which heavy libraries it imported.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/bench_idle_rss.py [--backends torch onnx onnx-int8] \
        [--policies hosted default] [--modes lazy preload] [--smaps 12] [--litellm-path DIR]

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
--modes: `lazy` (as shipped: the embedding session and the local model load at the first request that uses them) and
`preload` (Settings.preload, `serve --preload`: loaded before readiness), and `notrim` (lazy, with the store's
malloc_trim after an ingestion left out: the A/B of pipelines.memory). For the `default` policy each cell times two
short questions on the direct route (the first loads SmolLM2 when lazy) before the routed request (which loads the
embedding session when lazy), so the lazy cell's first-request latencies beside the preload cell's are what loading at
first use costs. --litellm-path: LiteLLM's proxy (bench_proxy's start_litellm, its extras from DIR) in the same run,
in front of a loopback upstream: RSS once /health/liveliness answers (20 s settled) and after one chat request.
The ONNX exports come from the shared model cache (pipelines.embedding.default_cache_dir), as a gateway finds them
after its first start: a cell that has to export first shows it in its ready time, not in its RSS (a child process).
"""

from __future__ import annotations

import argparse
import gc
import itertools
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


def short_question(base: str) -> float:
    """Seconds for one short question (the direct route: SmolLM2 alone, no documents, no embedding)."""
    import httpx

    body = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    started = time.perf_counter()
    httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600).raise_for_status()
    return time.perf_counter() - started


def cell(
    policy_name: str,
    backend: str,
    data_dir: str,
    smaps: int = 0,
    settle: tuple = (20.0,),
    preload: bool = False,
    ready_only: bool = False,
) -> dict:
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
    app = create_app(Settings(data_dir=Path(data_dir), preload=preload), policy=policy)
    after: dict = {}
    with serve_app(app) as base:
        ready = time.perf_counter() - started
        time.sleep(1.0)  # the gc-freeze thread
        gc.collect()
        idle = memory()
        imported = [m for m in HEAVY if m in sys.modules]
        if policy_name == "default" and not ready_only:
            questions = [short_question(base), short_question(base)]
            after_questions = memory()
            started = time.perf_counter()
            route = routed_request(base)
            routed_s = time.perf_counter() - started
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

            trim_started = time.perf_counter()
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            trim_ms = (time.perf_counter() - trim_started) * 1000
            pool = pyarrow.default_memory_pool()
            readings.append(
                {
                    "after_s": sum(settle),
                    "note": f"after another malloc_trim(0) ({trim_ms:.1f} ms); pyarrow {pool.backend_name} pool holds "
                    f"{pool.bytes_allocated() / 2**20:.0f} MB",
                    **memory(),
                }
            )
            after = {
                **readings[-1],
                "readings": readings,
                "questions_s": [round(q, 3) for q in questions],
                "after_questions": after_questions,
                "routed_s": round(routed_s, 2),
                "route": route,
                "imported": [m for m in HEAVY if m in sys.modules and m not in imported],
                "top": top_mappings(smaps),
            }
    return {
        "policy": policy_name,
        "mode": "preload" if preload else "lazy",
        "backend": backend,
        "ready_s": round(ready, 1),
        **idle,
        "imported": imported,
        "after": after,
    }


def litellm_rss(extra_path: str, data_dir: str) -> str:
    """LiteLLM's proxy (one worker, bench_proxy's configuration) in front of a loopback upstream: its RSS (with its
    children's) once it answers /health/liveliness and 20 s settled, and 20 s after one chat request."""
    import asyncio
    import multiprocessing
    import urllib.request

    from bench_proxy import free_port, rss_mb, run_upstream, start_litellm, wait_ready

    upstream_port, port = free_port(), free_port()
    upstream = multiprocessing.get_context("spawn").Process(target=run_upstream, args=(upstream_port,), daemon=True)
    upstream.start()
    litellm = start_litellm(port, upstream_port, data_dir, extra_path)
    if litellm is None:
        upstream.terminate()
        return "litellm: not measured (its proxy does not import)"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        time.sleep(20)
        ready = rss_mb(litellm.pid)
        asyncio.run(wait_ready(f"http://127.0.0.1:{port}/v1/chat/completions"))  # one chat request answered
        time.sleep(20)
        answered = rss_mb(litellm.pid)
        return (
            f"litellm  proxy   (its own process tree): ready RSS {ready:4.0f} MB; after one request {answered:4.0f} MB"
        )
    finally:
        litellm.terminate()
        litellm.wait(10)
        upstream.terminate()


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
    parser.add_argument("--modes", nargs="+", default=["lazy"], choices=("lazy", "preload", "notrim"))
    parser.add_argument("--litellm-path", help="measure LiteLLM's proxy too, its extra dependencies from DIR")
    parser.add_argument(
        "--ready-only",
        action="store_true",
        help="time readiness and read RSS only, no requests (repeat --modes, e.g. lazy preload lazy preload, to "
        "alternate them)",
    )
    parser.add_argument("--cell", nargs=4, help=argparse.SUPPRESS)  # policy backend data_dir mode: one child process
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if args.cell:
        policy_name, backend, data_dir, mode = args.cell
        if mode == "notrim":  # the A/B of round seven's malloc_trim after an ingestion: the store's call left out
            import pipelines.store.document_store as store_module

            store_module.release_freed_memory = lambda: False  # type: ignore[assignment]
        row = cell(
            policy_name,
            backend,
            data_dir,
            args.smaps,
            tuple(args.settle),
            preload=mode == "preload",
            ready_only=args.ready_only,
        )
        row["mode"] = mode
        print(json.dumps(row))
        return 0
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}, cores {len(os.sched_getaffinity(0))}")
    parent = Path(tempfile.mkdtemp(prefix="selfroute-rss-"))
    if args.litellm_path:
        print(litellm_rss(args.litellm_path, str(parent)))
    for n, (policy_name, mode, backend) in enumerate(itertools.product(args.policies, args.modes, args.backends)):
        if policy_name == "hosted" and mode != "lazy" and "lazy" in args.modes:
            continue  # nothing in-process to preload but the embedding session: one hosted row per backend
        data_dir = parent / f"{policy_name}-{mode}-{backend}-{n}"  # a mode repeated (alternated) gets its own
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--cell",
                policy_name,
                backend,
                str(data_dir),
                mode,
                "--smaps",
                str(args.smaps),
                *(["--ready-only"] if args.ready_only else []),
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
            f"{row['policy']:8s} {row['mode']:7s} {row['backend']:10s} ready ({row['ready_s']:5.1f} s): "
            f"{figures(row)}  imported: {' '.join(row['imported'])}"
        )
        after = row["after"]
        if after:
            first, second = after["questions_s"]
            print(
                f"{'':19s} short questions (direct route): first {first * 1000:.0f} ms, second "
                f"{second * 1000:.0f} ms; then {figures(after['after_questions'])}"
            )
            print(f"{'':19s} the routed request about new documents took {after['routed_s']:.2f} s")
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
