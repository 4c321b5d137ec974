"""Giving memory that was freed back to the operating system after a large embedding pass.

glibc's malloc keeps the memory a process frees in its heaps for reuse; onnxruntime's activations, LanceDB's write
buffers and the chunks of one ingestion are many medium allocations, so after a background ingestion of a new document
set the process keeps ~240 MB it no longer uses (BENCHMARKS.md §2, round six: 243 of the 427 MB one routed request
added). malloc_trim(0) returns the free pages of every heap to the kernel. glibc only (musl and other platforms have
no malloc_trim: nothing is done there)."""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# an ingestion that embedded at least this many chunks is followed by a trim: even an attached set of three short
# documents (~20 chunks) left ~240 MB freed but kept (BENCHMARKS.md §2, round six), and a trim costs milliseconds
# once per ingestion (timed by bench_idle_rss), not per request
TRIM_AFTER_CHUNKS = 1


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library this process runs on
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc's; absent from musl
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """malloc_trim(0): the free memory of glibc's heaps back to the kernel. False where there is no glibc."""
    trim = _malloc_trim()
    if trim is None:
        return False
    started = time.perf_counter()
    trim(0)
    log.debug("malloc_trim(0) in %.1f ms", (time.perf_counter() - started) * 1000)
    return True
