"""The benchmark scripts under test: each loaded from tests/benchmarks/ as a module of its own."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def load_bench() -> Iterator[Callable[[str], ModuleType]]:
    """load_bench("bench_forms") runs the script's module code under a name of its own, and
    takes it out of sys.modules after the test."""
    loaded: list[str] = []
    if str(BENCH) not in sys.path:  # a script imports its neighbours by name
        sys.path.insert(0, str(BENCH))

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up
        loaded.append(spec.name)
        spec.loader.exec_module(mod)
        return mod

    yield load
    for name in loaded:
        del sys.modules[name]
