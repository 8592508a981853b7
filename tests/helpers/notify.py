"""A stand-in for systemd's notify socket: an AF_UNIX datagram socket the test binds, and the
messages a service sends to it (READY=1, STATUS=..., WATCHDOG=1, STOPPING=1)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType


class NotifySocket:
    """Bind at `path` (a filesystem socket) or, with `abstract=True`, an abstract name.

    `address` is what goes into $NOTIFY_SOCKET ("@name" for an abstract socket).
    """

    def __init__(self, path: Path | None = None, *, abstract: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"llm-watchdog-test-{os.getpid()}-{id(self)}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            assert path is not None
            self.sock.bind(str(path))
            os.chmod(path, 0o777)  # a service under another uid must be able to send
            self.address = str(path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            with self._lock:
                self.messages.append((time.monotonic(), fields))

    def all(self) -> list[dict[str, str]]:
        with self._lock:
            return [m for _, m in self.messages]

    def count(self, key: str, value: str = "1", since: float = 0.0) -> int:
        with self._lock:
            return sum(1 for t, m in self.messages if t >= since and m.get(key) == value)

    def wait_for(self, key: str, value: str = "1", timeout_s: float = 30.0) -> dict[str, str]:
        """The first message with key=value; AssertionError with what came if none does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                for _, m in self.messages:
                    if m.get(key) == value:
                        return m
            time.sleep(0.02)
        raise AssertionError(f"no {key}={value} within {timeout_s} s; got {self.all()}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()

    def __enter__(self) -> NotifySocket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
