"""Gateway settings: where data lives, how to listen, which policy. Built by the CLI or by tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR_ENV = "SELFROUTE_DATA_DIR"
STORE_URI_ENV = "SELFROUTE_STORE_URI"
LEDGER_URL_ENV = "SELFROUTE_LEDGER_URL"
DEFAULT_DATA_DIR = Path.home() / ".selfroute"


def package_version() -> str:
    """The installed selfroute's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("selfroute")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def resolve_ledger_url(value: str | None = None) -> str | None:
    """--ledger-url, else $SELFROUTE_LEDGER_URL, else None (the SQLite file in the data directory)."""
    return value or os.environ.get(LEDGER_URL_ENV) or None


def resolve_data_dir(value: str | Path | None = None) -> Path:
    """--data-dir, else $SELFROUTE_DATA_DIR, else ~/.selfroute."""
    chosen = value or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(chosen).expanduser()


def private_dir(path: Path) -> Path:
    """Create a directory only its owner can enter (0700), or make an existing one so: it holds the ledger,
    with the questions clients asked, and the documents they sent."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def private_file(path: Path) -> Path:
    """Create a file only its owner can read (0600) if it does not exist yet. SQLite gives its -wal and -shm
    files the database file's permissions."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        # never open and close an existing file: closing any descriptor of it drops every POSIX lock this process
        # holds on it, SQLite's among them, and the next other process to close its connection then deletes the
        # WAL under this one's connections (their later writes were lost)
        pass
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return path


@dataclass
class Settings:
    data_dir: Path = field(default_factory=resolve_data_dir)
    policy_path: Path | None = None  # None: the shipped default policy
    cheap_model: str | None = None  # overrides the policy's cheap model
    long_model: str | None = None  # overrides the policy's long model
    cheap_window: int | None = None  # the overriding cheap model's context window, when litellm does not know it
    long_window: int | None = None  # the overriding long model's context window, when litellm does not know it
    keys_file: Path | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    vector_store_uri: str | None = field(default_factory=lambda: os.environ.get(STORE_URI_ENV) or None)
    ledger_url: str | None = field(default_factory=resolve_ledger_url)  # a SQLite path or postgresql://...
    access_log: bool = True  # one line per request on the selfroute.access logger (INFO)
    # load the in-process models (the embedding session, the local model) before readiness instead of at the first
    # request that uses them (gateway.server.startup): a warm first request for a gateway that holds them anyway
    preload: bool = False

    @property
    def ledger_path(self) -> Path:
        return self.data_dir / "ledger.sqlite3"

    @property
    def ledger_location(self) -> str | Path:
        """Where the ledger lives: a postgresql:// URL shared by replicas, or a SQLite file (default)."""
        return self.ledger_url or self.ledger_path

    @property
    def store_uri(self) -> str:
        """Any LanceDB URI (s3://bucket/path, gs://..., a folder); default: a folder under data_dir."""
        return self.vector_store_uri or str(self.data_dir / "lancedb")
