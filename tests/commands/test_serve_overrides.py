"""`serve --long-model` means what it says: the long route packs the new model's window (from litellm's model
information) less the answer reserve, not the embedded default's 2,048 tokens; start-up prints the effective
limits."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import openai

from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.tokens import count_tokens
from tests.support.servers import ServeProcess, serve_app

ROOT = Path(__file__).resolve().parents[2]


def _document(sentences: int) -> str:
    """Distinct numbered sentences, so a prompt can be checked for every one of them."""
    return "\n\n".join(
        f"Clause {i}. The harbour master records item {i} of the register in the ledger kept at berth {i % 40}."
        for i in range(sentences)
    )


def _long_prompt(fake, model: str) -> str:
    body = next(r["body"] for r in reversed(fake.state.received) if r["body"]["model"].endswith(model))
    return "\n".join(
        m["content"] if isinstance(m["content"], str) else " ".join(p.get("text", "") for p in m["content"])
        for m in body["messages"]
    )


def test_serve_long_model_packs_the_whole_document_for_that_models_window(upstream, tmp_path):
    base, fake = upstream
    log_path = tmp_path / "serve.log"
    env: dict[str, str | None] = {"OPENAI_API_BASE": f"{base}/v1", "OPENAI_API_KEY": "sk-fake-upstream"}
    for name in ("SELFROUTE_LEDGER_URL", "SELFROUTE_API_KEYS", "SELFROUTE_ADMIN_KEY", "SELFROUTE_STORE_URI"):
        env[name] = None
    served = ServeProcess("--data-dir", str(tmp_path / "data"), "--long-model", "openai/gpt-4.1", env=env, log=log_path)
    proc, url = served.process, served.url
    try:
        served.wait_ready(timeout=300)
        started = log_path.read_text()
        assert "long: openai/gpt-4.1: window 1,047,576 (litellm), output 32,768, $2/$8 per Mtok (litellm)" in started
        assert "long route: packs up to 1,046,552 tokens (window 1,047,576 less 1,024 kept for the answer)" in started
        assert "override: --long-model openai/gpt-4.1 replaces local/smollm2-135m-instruct" in started

        document = _document(1500)
        assert count_tokens(document) > 20_000  # ten times what the embedded default's long route packs
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        raw = client.chat.completions.with_raw_response.create(
            model="selfroute",
            messages=[{"role": "user", "content": "Where is item 1499 recorded?"}],
            extra_body={"selfroute": {"documents": [{"id": "register", "text": document}], "route": "long"}},
        )
        assert raw.headers["x-selfroute-route"] == "long"
        prompt = _long_prompt(fake, "gpt-4.1")
        missing = [i for i in range(1500) if f"Clause {i}. " not in prompt]
        assert not missing, f"{len(missing)} of 1500 clauses left out of the long prompt, first {missing[:5]}"
        assert raw.parse().usage.prompt_tokens > 20_000
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_smaller_long_model_is_packed_to_its_window_less_the_reserve(upstream, tmp_path, monkeypatch):
    """gpt-4's 8,192-token window: a 20,000-token document is cut to what fits, 8,192 less the 1,024 reserved."""
    base, fake = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-upstream")
    for name in ("SELFROUTE_API_KEYS", "SELFROUTE_ADMIN_KEY", "SELFROUTE_LEDGER_URL", "SELFROUTE_STORE_URI"):
        monkeypatch.delenv(name, raising=False)
    app = create_app(Settings(data_dir=tmp_path, long_model="openai/gpt-4"))
    assert app.state.limits.long_packing_tokens == 8192 - 1024
    # the default policy loads its classifier, verifier, embedding model and local model before it is ready
    with serve_app(app, wait_ready=False) as url:
        deadline = time.monotonic() + 300
        while httpx.get(f"{url}/health/readiness").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        client.chat.completions.create(
            model="selfroute",
            messages=[{"role": "user", "content": "Where is item 10 recorded?"}],
            extra_body={"selfroute": {"documents": [{"id": "register", "text": _document(1500)}], "route": "long"}},
        )
        tokens = count_tokens(_long_prompt(fake, "gpt-4"))
        assert 6000 < tokens <= 8192 - 1024, tokens
