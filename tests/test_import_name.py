"""llm-watchdog installs beside PyPI's `watchdog` (filesystem events), in either order.

PyPI's `watchdog` owns the import name `watchdog`; this project imports as `llm_watchdog`.
The test builds the project's wheel, makes fresh virtual environments and installs both
packages for real, old and new `watchdog` releases included, then runs the installed
commands. The project's own dependencies come from the test environment (a path entry),
so only the two packages under test are installed into each new environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
OLD_WATCHDOG = "watchdog==3.0.0"


def run(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # Outside the checkout: `python -c` puts the working folder first on sys.path, and the
    # checkout's source folder is itself named watchdog/.
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(sysconfig.get_path("purelib")).anchor,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


def pip(venv: Path, *args: str) -> None:
    done = run(
        sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", *args
    )
    if done.returncode != 0 and "No matching distribution" in done.stderr + done.stdout:
        pytest.skip(f"the package registry did not serve {args}: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, ROOT)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("llm_watchdog-*.whl")
    return built


def fresh_venv(path: Path) -> Path:
    done = run(sys.executable, "-m", "venv", "--without-pip", path)
    assert done.returncode == 0, done.stderr
    site = Path(
        run(
            path / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"
        ).stdout.strip()
    )
    # The test environment's site-packages after the new one's own: its dependencies (click,
    # httpx, ...) are found there, while what is installed here comes first.
    (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return path


def assert_both_work(venv: Path) -> None:
    helped = run(venv / "bin" / "llm-watchdog", "--help", timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "Keep chat fast" in helped.stdout
    as_module = run(venv / "bin" / "python", "-m", "llm_watchdog", "--version", timeout=60)
    assert as_module.returncode == 0 and "llm-watchdog" in as_module.stdout, as_module.stderr
    probe = (
        "import watchdog.observers, llm_watchdog, llm_watchdog.cli, os.path as p;"
        "print(p.dirname(watchdog.observers.__file__)); print(llm_watchdog.__file__)"
    )
    both = run(venv / "bin" / "python", "-c", probe, timeout=60)
    assert both.returncode == 0, both.stderr
    observers, ours = both.stdout.split()
    assert str(venv) in observers and str(venv) in ours  # each from its own installed copy


def test_project_after_watchdog_then_watchdog_upgraded(wheel: Path, tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "a")
    pip(venv, "--no-deps", OLD_WATCHDOG)
    pip(venv, "--no-deps", str(wheel))
    assert_both_work(venv)
    pip(venv, "--no-deps", "--upgrade", "watchdog")
    assert_both_work(venv)


def test_watchdog_after_project(wheel: Path, tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "b")
    pip(venv, "--no-deps", str(wheel))
    pip(venv, "--no-deps", "watchdog")
    assert_both_work(venv)
