"""What can be checked of the Dockerfile without a Docker daemon: the build context keeps every file the
package installs from, and the probe and command it names exist."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

from gateway.cli import build_parser
from gateway.server.app import create_app
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = path.split("/")
    for pattern in patterns:
        pattern = pattern.removeprefix("**/")
        if fnmatch.fnmatch(path, pattern) or any(fnmatch.fnmatch(p, pattern) for p in parts):
            return True
    return False


def test_the_build_context_holds_the_package_sources():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files", "gateway", "classifier", "pipelines", "policies", "pyproject.toml", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "pipelines/samples/harbour/berth-lease.md" in tracked
    assert [f for f in tracked if _ignored(f, patterns)] == []


def test_the_probe_and_the_command_exist(tmp_path):
    probe = re.search(r"HEALTHCHECK .*?'http://127\.0\.0\.1:8000(/[^']+)'", DOCKERFILE).group(1)
    app = create_app(Settings(data_dir=tmp_path))
    assert probe == "/health/readiness" and probe in {getattr(r, "path", None) for r in app.routes}
    command = re.search(r"^CMD \[(.*)\]$", DOCKERFILE, re.M).group(1)
    argv = [a.strip().strip('"') for a in command.split(",")]
    assert argv[0] == "selfroute"
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 8000)
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in DOCKERFILE
    assert "docker build -t selfroute ." in (ROOT / "README.md").read_text()
