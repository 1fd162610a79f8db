"""The host allocator a CPU benchmark runs under: glibc's default, or its heap kept.

A compiled CPU step frees several `[rows, V]` float32 buffers at once (31 MiB each at
64 x 128,256). glibc's malloc serves blocks that large with mmap, or trims them off its heap
when freed, so every step page-faults its buffers in afresh: about 15 of a 40 ms compiled
step at 64 x 128,256 on the 2-core development machine (perf/README.md). An engine serving on
a CPU avoids this with a caching allocator (tcmalloc or jemalloc preloaded, as vLLM's CPU
guide recommends); `keep_heap` is glibc's own way: no mmap for large blocks, no trimming, so
freed buffers are reused. It applies to the whole process, so every provider of a run gets
the same allocator and the ratios stay like for like.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Literal

Allocator = Literal["heap", "system"]
ALLOCATORS: tuple[Allocator, ...] = ("heap", "system")

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # an int; glibc stores it as a size_t threshold


def keep_heap() -> bool:
    """Make glibc keep freed memory for reuse (no mmap, no trim) for the rest of the
    process; True where it took effect, False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on error (glibc; musl has no mallopt)
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


def use_allocator(allocator: Allocator) -> str:
    """Set the process's host allocator for a benchmark; returns what is in effect, for
    the run's context: "heap" (glibc, freed memory kept) or "system" (left as it was)."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    if allocator == "heap" and keep_heap():
        return "heap"
    return "system"
