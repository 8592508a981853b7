"""SIGKILL at random points, 50 times, while a process writes probes and GPU samples through
the store as the daemon does: after every kill the file passes SQLite's integrity check, every
row the writer reported committed is there, and the writer lock is free again."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_watchdog.store.db import Store
from llm_watchdog.store.lock import WriterLock

ROOT = Path(__file__).resolve().parents[2]
KILLS = 50

WRITER = """
import sys, time
from llm_watchdog.models import GpuSample
from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result
store = Store(sys.argv[1], exclusive=True)
print("open", flush=True)
n = 0
while True:
    n += 1
    rid = store.record_probe(probe_result(ts=time.time(), answer="x" * (n % 500)), None)
    now = time.time()
    store.record_gpu_samples([GpuSample(ts=now, gpu_index=i, temp_c=60.0) for i in range(2)])
    if n % 25 == 0:
        store.rollup(now, 14 * 86400)  # folds minutes, deletes nothing within the retention
    print(rid, flush=True)  # committed: the row must survive any kill after this line
"""


@pytest.mark.slow
def test_sigkill_at_random_points_50_times_loses_no_committed_row(db_path: Path) -> None:
    rng = random.Random(16)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    committed: set[int] = set()
    for _ in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "open", (
                proc.stderr.read() if proc.stderr else ""
            )
            time.sleep(rng.uniform(0.0, 0.25))  # a random point among the writes
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        committed.update(int(line) for line in out.split() if line.isdigit())
        with Store(db_path, read_only=True) as s:
            assert s.rows("PRAGMA integrity_check")[0]["integrity_check"] == "ok"
            stored = {r["id"] for r in s.rows("SELECT id FROM probes")}
            samples = s.rows("SELECT COUNT(*) AS n FROM gpu_samples")[0]["n"]
        assert committed <= stored, sorted(committed - stored)[:5]
        assert samples >= 2 * len(committed)  # each probe's samples were committed before it
        WriterLock(db_path).acquire().release()  # the kernel freed the dead writer's lock
    assert len(committed) > KILLS  # the kills landed among writes, not before the first
