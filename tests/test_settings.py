"""gateway/settings.py: the data directory and its private files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from gateway.settings import private_file


def _count_elsewhere(path) -> int:
    """The rows another process sees, through its own connection, closed at once (as `selfroute keys`, `costs` or a
    second worker's short-lived connections do)."""
    code = (
        f"import sqlite3; c = sqlite3.connect({str(path)!r}); print(c.execute('SELECT count(*) FROM t').fetchone()[0])"
    )
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_private_file_on_an_open_database_keeps_its_locks(tmp_path):
    """The probe's finding: private_file opened and closed the ledger file while this process had SQLite connections
    on it (KeyStore's first connection comes after the writer's), which dropped their POSIX locks; the next other
    process to close a connection took the database for unused and deleted its WAL, and every later write of this
    process went to the deleted file."""
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(private_file(path))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # the rows stay in the WAL, as between checkpoints
    with conn:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    assert private_file(path) == path  # a second store of the same process opening the ledger
    assert _count_elsewhere(path) == 10
    assert path.with_name(path.name + "-wal").exists()
    with conn:
        conn.execute("INSERT INTO t VALUES (10)")
    assert _count_elsewhere(path) == 11  # was 10: the write went to a deleted WAL
    conn.close()


def test_private_file_creates_a_file_only_its_owner_reads(tmp_path):
    made = private_file(tmp_path / "new.sqlite3")
    assert made.exists() and made.stat().st_mode & 0o777 == 0o600
    loose = tmp_path / "loose"
    loose.write_text("kept")
    loose.chmod(0o644)
    assert private_file(loose).stat().st_mode & 0o777 == 0o600 and loose.read_text() == "kept"
