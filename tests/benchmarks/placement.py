"""Where a benchmark's processes run: the process under test on a core of its own.

On a machine with few cores, a server and the client that times it share time slices, and
the wait for the other's slice reads as latency of whatever is measured.
"""

from __future__ import annotations

import os


def split_cpus(enabled: bool = True) -> tuple[set[int], set[int]] | None:
    """(one core for the process under test, the others), or None where that is not possible."""
    if not enabled or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[-1]}, set(cpus[:-1])
