"""The daemon gives the C heap's free memory back to the system after each rollup."""

from __future__ import annotations

import platform
from pathlib import Path

from llm_watchdog.daemon import service
from llm_watchdog.daemon.memory import release_free_memory
from llm_watchdog.store.db import Store
from tests.daemon.test_daemon import settings_for
from tests.helpers.fakenvml import scenario_basic
from tests.helpers.streamserver import closed_port_url

GLIBC = platform.libc_ver()[0] == "glibc"


def anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_free_pages_in_the_middle_of_the_heap_go_back_to_the_system():
    assert release_free_memory() is GLIBC
    if not GLIBC:
        return
    # 64 KiB blocks come from the heap (under malloc's mmap threshold). Keeping every tenth
    # strands the other nine between them: free to malloc, still resident.
    blocks = [bytearray(64 * 1024) for _ in range(2000)]
    kept = blocks[::10]
    del blocks
    before = anon_mb()
    assert release_free_memory()
    after = anon_mb()
    assert before - after > 50, f"RssAnon {before:.1f} -> {after:.1f} MB"
    assert len(kept) == 200


def test_the_rollup_job_releases_free_memory(db_path, monkeypatch):
    calls = []
    monkeypatch.setattr(service, "release_free_memory", lambda: calls.append(1) or True)
    with Store(db_path) as store:
        daemon = service.Daemon(
            settings_for(closed_port_url(), db_path), store, nvml=scenario_basic()
        )
        daemon.rollup()
        daemon.rollup()
    assert calls == [1, 1]
