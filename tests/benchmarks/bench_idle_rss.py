"""Idle RSS of a ready gateway, per policy and embedding backend, and which heavy libraries it imported.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/bench_idle_rss.py [--backends torch onnx onnx-int8]

Each cell is its own process: the app (gateway.server.app.create_app) under a real uvicorn on port 0, waited for
until its readiness probe would say ready (every model the policy needs loaded, the store open, litellm's prices
warm), then a full collection, and /proc/self/status's VmRSS read. Policies: `default` (the shipped
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


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def cell(policy_name: str, backend: str, data_dir: str) -> dict:
    from gateway.server.app import create_app
    from gateway.settings import Settings
    from policies.loader import load_policy
    from tests.support.policies import Whole, fake_route, make_policy
    from tests.support.servers import serve_app

    base = "http://127.0.0.1:9"  # never called: the cell only starts the gateway
    if policy_name == "default":
        policy, _ = load_policy(ROOT / "policies" / "default.yaml")
        rag = policy.rag.model_copy(update={"embedding_backend": backend})
        policy = policy.model_copy(update={"rag": rag})
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
    with serve_app(app):
        ready = time.perf_counter() - started
        time.sleep(1.0)  # the gc-freeze thread
        gc.collect()
        rss = rss_mb()
    return {
        "policy": policy_name,
        "backend": backend,
        "rss_mb": round(rss),
        "ready_s": round(ready, 1),
        "imported": [m for m in HEAVY if m in sys.modules],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["torch", "onnx", "onnx-int8"])
    parser.add_argument("--policies", nargs="+", default=["hosted", "default"])
    parser.add_argument("--cell", nargs=3, help=argparse.SUPPRESS)  # policy backend data_dir: one child process
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if args.cell:
        print(json.dumps(cell(*args.cell)))
        return 0
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}, cores {len(os.sched_getaffinity(0))}")
    parent = Path(tempfile.mkdtemp(prefix="selfroute-rss-"))
    for policy_name in args.policies:
        for backend in args.backends:
            data_dir = parent / f"{policy_name}-{backend}"
            out = subprocess.run(
                [sys.executable, __file__, "--cell", policy_name, backend, str(data_dir)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            if out.returncode != 0:
                print(f"{policy_name} {backend}: failed\n{out.stderr[-3000:]}")
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{row['policy']:8s} {row['backend']:10s} RSS {row['rss_mb']:5d} MB  ready {row['ready_s']:5.1f} s  "
                f"imported: {' '.join(row['imported'])}"
            )
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
