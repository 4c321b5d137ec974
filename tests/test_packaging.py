"""The built wheel holds every module and data file of the source tree, and its CLI runs from a fresh venv."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "classifier", "pipelines", "policies")


def source_files() -> set[str]:
    tracked = subprocess.run(["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True, check=True)
    return {line for line in tracked.stdout.splitlines() if line and "__pycache__" not in line}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [built] = out.glob("selfroute-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_source_and_data_file(wheel):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the list of source files comes from git")
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
    missing = sorted(source_files() - inside)
    assert missing == [], f"files of the source tree missing from the wheel: {missing}"
    assert "gateway/commands/serve.py" in inside and "gateway/ledger/migrations/sqlite/001_ledger.sql" in inside


@pytest.mark.slow
def test_the_cli_runs_from_the_wheel_in_a_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # the dependencies come from the test environment's site-packages (the machine has no internet); selfroute
    # itself only from the wheel: a .pth line adds a path without running that folder's own .pth files, so the
    # test environment's editable install of this checkout stays out
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # nor the checkout on PYTHONPATH (the suite runs with it set in worktrees; pip would take the build's egg-info
    # there for an installed selfroute and skip the wheel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        capture_output=True,
        env=env,
    )
    where = subprocess.run(
        [str(python), "-c", "import gateway.commands; print(gateway.commands.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    where = where.stdout
    assert where.startswith(str(env_dir)), where
    cli = env_dir / "bin" / "selfroute"
    help_text = subprocess.run(
        [str(cli), "--help"], cwd=tmp_path, capture_output=True, text=True, check=True, env=env
    ).stdout
    assert "serve" in help_text and "ingest" in help_text
    check = subprocess.run([str(cli), "policy", "check"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
