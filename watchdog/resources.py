"""Where the files that ship with llm-watchdog live.

In the repository the canary prompt sets sit in `probes/` and the heat-lab scenarios in
`data/scenarios/`, plain text a user can read and copy. A wheel installs the same files
inside the package (see `package-dir` in pyproject.toml); a source checkout or an
editable install reads them where they are.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_SOURCE_DIRS = {
    "probesets": ("probes",),
    "scenarios": ("data", "scenarios"),
    "systemd": ("systemd",),
}


def bundled_dir(kind: str) -> Path:
    """Folder of bundled files of `kind` ("probesets", "scenarios" or "systemd")."""
    installed = _PACKAGE / kind
    if installed.is_dir():
        return installed
    return _PACKAGE.parent.joinpath(*_SOURCE_DIRS[kind])


def package_file(name: str) -> Path:
    """A file shipped inside the package itself (e.g. the example config)."""
    return _PACKAGE / name
