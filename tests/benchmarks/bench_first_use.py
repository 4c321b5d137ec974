"""What loading at first use adds to the first request: the in-process models' load, timed in fresh processes.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/bench_first_use.py [--rounds 5]

Since round seven a ready gateway has checked the in-process models' files but not loaded them (gateway.server.startup):
the first request that uses one pays its load, the requests after it do not. Each round is two fresh interpreters, as
a gateway's first request finds them: one times SmolLM2 (LocalModelUpstream.prepare, then load: importing llama-cpp
and mapping the weights, the 2,048-token context) and one short generation after it; the other the embedding model
(Embedder.prepare, then the first question: importing onnxruntime and tokenizers, the session, one question) and a
second question. The rounds alternate the two; medians and ranges are printed with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOCAL = """
import json, time
import anyio
from gateway.upstreams.local import LocalModelUpstream
from policies.schema import ModelConfig
config = ModelConfig(model="local/smollm2-135m-instruct", timeout=600)
upstream = LocalModelUpstream()
t0 = time.perf_counter(); upstream.prepare(config); t1 = time.perf_counter()
upstream.load(config); t2 = time.perf_counter()
body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8, "temperature": 0}
anyio.run(upstream.complete, config, body); t3 = time.perf_counter()
anyio.run(upstream.complete, config, body); t4 = time.perf_counter()
print(json.dumps({"prepare": t1 - t0, "load": t2 - t1, "first": t3 - t2, "second": t4 - t3}))
"""

EMBED = """
import json, sys, time
from pipelines.embedding import Embedder
embedder = Embedder(backend=sys.argv[1])
t0 = time.perf_counter(); embedder.prepare(); t1 = time.perf_counter()
embedder.embed_queries(["Who maintains the fenders at Berth 7?"]); t2 = time.perf_counter()
embedder.embed_queries(["Which berth has the deepest draught?"]); t3 = time.perf_counter()
print(json.dumps({"prepare": t1 - t0, "load_and_first": t2 - t1, "second": t3 - t2}))
"""


def run(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"median {statistics.median(ms):7.0f} ms (range {ms[0]:.0f}-{ms[-1]:.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="onnx", help="the embedding backend timed (default onnx)")
    args = parser.parse_args()
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}, cores {len(os.sched_getaffinity(0))}")
    local: list[dict] = []
    embed: list[dict] = []
    for _ in range(args.rounds):
        local.append(run(LOCAL))
        embed.append(run(EMBED, args.backend))
    print("SmolLM2 (local/smollm2-135m-instruct):")
    for name, what in (
        ("prepare", "start-up's check (before readiness)"),
        ("load", "load at the first request (import llama-cpp, weights, context)"),
        ("first", "first generation after the load (8 tokens)"),
        ("second", "second generation"),
    ):
        print(f"  {what:66s} {summary([r[name] for r in local])}")
    print(f"embedding model ({args.backend}):")
    for name, what in (
        ("prepare", "start-up's check (files, export cached)"),
        ("load_and_first", "first question: import, session, embed"),
        ("second", "second question"),
    ):
        print(f"  {what:66s} {summary([r[name] for r in embed])}")
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
