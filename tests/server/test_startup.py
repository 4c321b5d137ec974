"""Start-up loads what the policy needs, once: a gateway whose models are all on an OpenAI-compatible upstream
imports neither torch nor llama-cpp nor litellm (each process checked from a clean interpreter), a policy model that
litellm translates has litellm imported before readiness, and an embedding model that does not load fails the
start, not the first request."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx

from gateway.server.app import create_app
from gateway.settings import Settings
from tests.support.policies import make_policy
from tests.support.servers import serve_app

HEAVY = ("torch", "sentence_transformers", "transformers", "llama_cpp", "litellm")

CHILD = """
import json, sys
from pathlib import Path
from gateway.server.app import create_app
from gateway.settings import Settings
from tests.support.policies import fake_route, make_policy, model_route
from tests.support.servers import serve_app

base = "http://127.0.0.1:9"  # never called
long = model_route("anthropic/claude-3-5-sonnet-20241022", api_key_env="NO_SUCH_KEY") if sys.argv[2] == "litellm" else None
policy = make_policy(base, **({"long": long} if long else {}))
app = create_app(Settings(data_dir=Path(sys.argv[1])), policy=policy)
with serve_app(app):
    print(json.dumps({"ready": app.state.gateway.startup.ready, "imported": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _ready_gateway_imports(tmp_path, variant: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), variant], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_gateway_on_an_openai_compatible_upstream_imports_no_torch_llama_or_litellm(tmp_path):
    found = _ready_gateway_imports(tmp_path, "direct")
    assert found == {"ready": True, "imported": []}


def test_a_policy_model_that_litellm_translates_has_it_imported_before_readiness(tmp_path):
    found = _ready_gateway_imports(tmp_path, "litellm")
    assert found["ready"] and found["imported"] == ["litellm"]


def test_an_embedding_model_that_does_not_load_fails_the_start(upstream, tmp_path):
    missing = tmp_path / "no-model-here"
    missing.mkdir()
    policy = make_policy(upstream[0], rag={"embedding_model": str(missing)})
    app = create_app(Settings(data_dir=tmp_path / "data"), policy=policy)
    with serve_app(app, wait_ready=False) as url:
        for _ in range(3000):
            probe = httpx.get(f"{url}/health/readiness")
            if probe.json()["status"] != "starting":
                break
            time.sleep(0.05)
        assert probe.status_code == 503 and probe.json() == {"status": "failed", "reason": "build_failed"}
    assert app.state.gateway.startup.error is not None
