"""Files other processes read while they are written: model files and policy files (a gateway's reload, on any
worker or replica, may read one at any moment)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write `data` to `path` so that a reader finds the old file or the whole new one, never a part: a temporary
    file in the same folder, flushed to disk, then renamed over the target (os.replace is atomic on one file
    system). The target keeps its permission bits when it exists."""
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        if target.exists():
            os.chmod(temporary, target.stat().st_mode & 0o7777)
        else:  # what a plain open() would have made (mkstemp makes 0600)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
