"""The README's quick start, run as a new user would: its code blocks in order, against a live gateway
started by the real CLI (`selfroute serve`, a subprocess on a free port) whose models are the fake
OpenAI-compatible upstream (--cheap-model/--long-model and $OPENAI_API_BASE), with a fresh data directory.

Blocks come from the "Quick start" section, the explain curl of "How a routed request is decided" and the
"Cost logs and dashboard" commands. A line that starts the gateway (`selfroute serve`) is left out: the
test's gateway stands in for it. `.venv/bin/selfroute` is a wrapper around this checkout's CLI."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)


def section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def quick_start_blocks() -> list[tuple[str, str]]:
    blocks = BLOCK.findall(section("Quick start").split("\n### ")[0])  # not "Using hosted models": keys needed
    blocks += [b for b in BLOCK.findall(section("How a routed request is decided")) if "/v1/route/explain" in b[1]]
    blocks += BLOCK.findall(section("Cost logs and dashboard"))
    return blocks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def live(upstream, tmp_path_factory):
    """(port, env, workdir) of `selfroute serve` running the default policy with the fake upstream's models."""
    work = tmp_path_factory.mktemp("readme")
    wrapper = work / ".venv" / "bin" / "selfroute"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gateway.cli "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SELFROUTE_DATA_DIR": str(work / "data"),
        "OPENAI_API_BASE": f"{upstream[0]}/v1",
        "OPENAI_API_KEY": "sk-fake",
    }
    port = _free_port()
    log = open(work / "serve.log", "w")
    server = subprocess.Popen(
        [
            str(wrapper),
            "serve",
            "--port",
            str(port),
            "--cheap-model",
            "openai/fake-cheap",
            "--long-model",
            "openai/fake-long",
            "--cheap-window",
            "8192",
            "--long-window",
            "16000",
        ],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (work / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/readiness").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not get ready"
            time.sleep(0.2)
        yield port, env, work
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _run(kind: str, code: str, port: int, env: dict, work: Path) -> subprocess.CompletedProcess:
    code = code.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace("localhost:8000", f"localhost:{port}")
    if kind == "bash":
        code = "\n".join(line for line in code.splitlines() if not re.search(r"selfroute serve\b", line))
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        command = [sys.executable, "-c", code]
    return subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)


def test_the_quick_start_runs_as_written(live):
    port, env, work = live
    blocks = quick_start_blocks()
    assert [kind for kind, _ in blocks] == ["bash", "python", "bash", "bash"]
    outputs = []
    for kind, code in blocks:
        result = _run(kind, code, port, env, work)
        assert result.returncode == 0, (
            f"{kind} block failed:\n{code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
        outputs.append(result.stdout)
    ingest, client, explain, costs = outputs

    assert ingest.startswith("harbour: 3 added") and "berth-lease.md" in ingest and "route:" in ingest
    lines = client.splitlines()
    assert lines[0].startswith("echo: ") and "capital of France" in lines[0]  # the fake upstream echoes
    assert lines[1].strip().startswith("echo:")  # the stream, word by word
    route, reason = lines[2].split(" ", 1)
    assert route in {"rag", "long", "rag>long", "direct"} and reason
    assert lines[4].startswith("direct echo:")  # the short attached lease goes whole to the cheap model
    assert lines[5].startswith("384 [") and "'local/all-minilm-l6-v2'" in lines[5] and lines[5].endswith(" selfroute")
    decision = json.loads(explain)
    assert decision["object"] == "route.explanation" and decision["source"] == "collection"
    assert decision["features"]["n_documents"] == 3
    assert (work / "requests.csv").read_text().count("\n") >= 6  # header and the quick start's requests


def test_the_readme_names_only_shipped_collections():
    used = set(
        re.findall(r'"collection": "([^"]+)"', section("Quick start") + section("How a routed request is decided"))
    )
    used |= set(re.findall(r'X-Selfroute-Collection": "([^"]+)"', README))
    assert used == {"harbour"}
