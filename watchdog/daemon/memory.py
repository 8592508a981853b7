"""Giving the C heap's free memory back to the system.

A daemon that runs for weeks frees memory in the middle of glibc's heap (a rollup's rows, a
probe's answer, a pruning pass) that malloc keeps for reuse and does not return, so RSS
creeps up by what fragmentation strands though nothing is leaked (docs/reliability.md,
the simulated week). `malloc_trim(0)` hands every free page back, those inside the heap
too (glibc 2.8 and later). Where the C library has no `malloc_trim` (musl, macOS) this
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _looked
    if not _looked:
        _looked = True
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
            fn = getattr(libc, "malloc_trim", None)
        except OSError:
            fn = None
        if fn is not None:
            fn.argtypes = [ctypes.c_size_t]
            fn.restype = ctypes.c_int
            _trim = fn
    return _trim


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
