"""gateway.files.write_atomic: a reader (a gateway reloading on another worker or replica) never sees half a file."""

from __future__ import annotations

import os
import threading

import pytest

from gateway.files import write_atomic


def test_a_reader_finds_the_old_file_or_the_whole_new_one(tmp_path):
    """Readers racing the writer: every read is one whole version (a plain write_text fails this: truncated reads)."""
    target = tmp_path / "model.skops"
    size = 2_000_000
    versions = [bytes([65 + i]) * size for i in range(2)]
    write_atomic(target, versions[0])
    seen: list[bytes] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.append(target.read_bytes()[:1] + bytes([len(target.read_bytes()) == size]))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for round_ in range(40):
            write_atomic(target, versions[round_ % 2])
    finally:
        stop.set()
        reader.join()
    assert seen and all(whole == 1 for _, whole in seen)
    assert target.read_bytes() == versions[1] and [p.name for p in tmp_path.iterdir()] == ["model.skops"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "policy.yaml"
    write_atomic(target, "old: 1\n")
    os.chmod(target, 0o640)

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        write_atomic(target, "new: 2\n")
    monkeypatch.undo()
    assert target.read_text() == "old: 1\n" and [p.name for p in tmp_path.iterdir()] == ["policy.yaml"]
    write_atomic(target, "new: 2\n")  # a rewrite keeps the file's permissions
    assert target.read_text() == "new: 2\n" and target.stat().st_mode & 0o777 == 0o640
