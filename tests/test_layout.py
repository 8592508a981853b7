"""The shape of the source tree: no import cycles, packages by concern, nothing from outside.

The module graph is built from the sources with `ast` (imports under `if TYPE_CHECKING:` left
out, since they never run), so a cycle fails here before it fails at import time in some
order a user happens to hit.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "watchdog"
NAME = "llm_watchdog"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = [NAME, *path.relative_to(src).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports when it runs.

    `from pkg import name` is an edge to `pkg.name` where that is a module, else to `pkg`;
    the parent packages that Python initialises on the way are not counted, as in the
    usual import linters.
    """
    files = {module_name(p, src): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}

    def resolve(target: str) -> str | None:
        while target and target not in files:
            target = target.rpartition(".")[0]
        return target or None

    for mod, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _type_checking(node):
                for sub in node.body:
                    skipped.update(id(n) for n in ast.walk(sub))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for t in targets:
                if t == NAME or t.startswith(NAME + "."):
                    found = resolve(t)
                    if found and found != mod:
                        graph[mod].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycles() -> None:
    found = cycles(import_graph(SRC))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    # The check above can fail: two modules that import each other are reported.
    src = tmp_path / "watchdog"
    (src / "a").mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "a" / "__init__.py").write_text("")
    (src / "a" / "x.py").write_text("from llm_watchdog.a import y\n")
    (src / "a" / "y.py").write_text("import llm_watchdog.a.x\n")
    (src / "z.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llm_watchdog.a import x\n"
    )
    (src / "w.py").write_text("from llm_watchdog import z\n")
    graph = import_graph(src)
    assert cycles(graph) == [["llm_watchdog.a.x", "llm_watchdog.a.y"]]
    assert graph["llm_watchdog.z"] == set()  # imports under TYPE_CHECKING never run


def test_the_tree_shows_the_layers() -> None:
    flat = sorted(p.stem for p in SRC.glob("*.py") if p.name != "__init__.py")
    assert len(flat) <= 12, f"{len(flat)} modules flat at the top of watchdog/: {flat}"
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    for concern in ("nvml", "probe", "store", "drift", "alerts", "control", "actuators"):
        assert concern in packages
    for concern in ("gateway", "daemon", "cli", "sim"):
        assert concern in packages


def test_only_the_nvml_package_and_the_labs_fake_of_it_import_pynvml() -> None:
    # The heat lab's fake NVML takes the real module's constants and error class, so that
    # code written against pynvml meets the same values; nothing else may import it.
    users = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(r"^\s*(import pynvml|from pynvml)", p.read_text(encoding="utf-8"), re.M)
    )
    lab_fake = {"sim/fakenvml.py", "sim/remote.py"}
    assert users and all(u.startswith("nvml/") or u in lab_fake for u in users), users


def test_only_the_store_package_writes_sql() -> None:
    sql = re.compile(r"\b(SELECT\s+\S+\s+FROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b")
    outside = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if not p.relative_to(SRC).parts[0] == "store" and sql.search(p.read_text("utf-8"))
    )
    assert not outside, f"SQL outside watchdog/store/: {outside}"


def test_every_package_is_in_the_wheel() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(project["tool"]["setuptools"]["packages"])
    on_disk = {module_name(p) for p in SRC.rglob("__init__.py")}
    assert on_disk <= listed, f"packages missing from pyproject.toml: {sorted(on_disk - listed)}"
    assert project["tool"]["setuptools"]["package-dir"][NAME] == "watchdog"


@pytest.mark.parametrize("folder", ["watchdog", "tests", ".ci", "systemd", "probes", "data"])
def test_nothing_refers_to_files_outside_the_repository(folder: str) -> None:
    # Spelled in pieces, so that this file does not itself read as such a reference.
    shared = "shared"
    outside = re.compile(rf"\.\./{shared}|{shared}/fixtures|{shared}/DESIGN|DESIGN\.md")
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in (ROOT / folder).rglob("*")
        if p.is_file()
        and p.suffix in {".py", ".md", ".toml", ".service", ".sh", ""}
        and p.resolve() != Path(__file__).resolve()
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert not hits, hits
