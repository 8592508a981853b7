"""HAProxy's runtime API as an actuator: a server's maxconn is the allowance."""

from __future__ import annotations

import csv
import io
import socket
from typing import Any

from llm_watchdog.actuators.base import (
    ActuatorError,
    ApplyResult,
    ReadBack,
    Verification,
    verify_with,
)


class HaproxyActuator:
    """HAProxy's runtime API over its stats socket (`stats socket ... level admin`).

    The allowance is the server's maxconn: `set maxconn server <backend>/<server> <n>`;
    excess requests wait in the backend queue for at most `timeout queue`, then get a 503.
    What HAProxy 2.6 allows at runtime, checked against 2.6.12:
    - maxconn 0 means *no limit* (show stat's `slim` goes empty), so allowance 0 is written
      as `set server <backend>/<server> state maint` instead, and lifted when n > 0;
    - `timeout queue` cannot be changed at runtime ("'set timeout' only supports 'cli'"):
      it belongs in haproxy.cfg, and the read-back cannot report it;
    - there are no leases: a value stays until changed, so the daemon must keep writing.
    Read-back is `show stat`: the server's `slim` (maxconn), `scur` (in flight), `status`,
    and `qcur` (queued) of the server and of its backend.
    """

    def __init__(
        self, socket_path_or_addr: str, backend: str, server: str, *, timeout_s: float = 2.0
    ) -> None:
        self.address = socket_path_or_addr
        self.backend = backend
        self.server = server
        self.timeout_s = timeout_s
        self.name = f"haproxy {backend}/{server}"
        self._maint_by_us = False

    def _connect(self) -> socket.socket:
        addr = self.address
        if addr.startswith("unix@"):
            addr = addr[5:]
        if "/" in addr or ":" not in addr:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = addr
        else:
            host, _, port = addr.removeprefix("ipv4@").rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            target = (host, int(port))
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(target)
        except BaseException:
            sock.close()
            raise
        return sock

    def command(self, line: str) -> str:
        """Send one runtime API command and return HAProxy's answer (raises ActuatorError)."""
        hint = f"is haproxy running with `stats socket {self.address} level admin`?"
        try:
            with self._connect() as sock:
                sock.sendall(line.encode() + b"\n")
                chunks = []
                while True:
                    data = sock.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
        except FileNotFoundError:
            raise ActuatorError(f"no HAProxy stats socket at {self.address}: {hint}") from None
        except ConnectionRefusedError:
            raise ActuatorError(
                f"cannot reach HAProxy at {self.address} (connection refused): {hint}"
            ) from None
        except PermissionError:
            raise ActuatorError(
                f"cannot open {self.address} (permission denied): run the daemon as a user "
                "that may use the stats socket (its `user`/`group`/`mode`)"
            ) from None
        except TimeoutError:
            raise ActuatorError(
                f"HAProxy at {self.address} did not answer `{line.split()[0]}` "
                f"within {self.timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise ActuatorError(f"cannot talk to HAProxy at {self.address}: {exc}") from exc
        return b"".join(chunks).decode("utf-8", "replace")

    def _set(self, line: str) -> None:
        answer = self.command(line).strip()
        if not answer:
            return  # HAProxy answers a successful set with an empty line
        if "permission denied" in answer.lower():
            raise ActuatorError(f"HAProxy refused `{line}`: the stats socket needs `level admin`")
        if "no such" in answer.lower():
            raise ActuatorError(
                f"HAProxy has no server {self.backend}/{self.server} ({answer.splitlines()[0]}): "
                "check the names with `show servers state`"
            )
        raise ActuatorError(f"HAProxy refused `{line}`: {answer.splitlines()[0]}")

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult:
        srv = f"{self.backend}/{self.server}"
        try:
            if allowance <= 0:
                self._set(f"set server {srv} state maint")
                self._maint_by_us = True
                done = f"{self.name}: in maintenance (allowance 0; maxconn 0 would mean no limit)"
            else:
                self._set(f"set maxconn server {srv} {allowance}")
                if self._maint_by_us:
                    self._set(f"set server {srv} state ready")
                    self._maint_by_us = False
                done = f"{self.name}: maxconn {allowance}"
        except ActuatorError as exc:
            return ApplyResult(False, allowance, str(exc))
        return ApplyResult(True, allowance, f"{done} (no lease: HAProxy keeps it until changed)")

    def read_back(self) -> ReadBack:
        text = self.command("show stat")
        rows = csv.reader(io.StringIO(text.lstrip("# ")))
        header = next(rows, None)
        if not header or "pxname" not in header:
            raise ActuatorError(f"HAProxy's `show stat` gave no CSV header: {text[:80]!r}")
        col = {name: i for i, name in enumerate(header)}
        server: list[str] | None = None
        backend_queued = 0
        for row in rows:
            if len(row) < len(col) - 1 or row[col["pxname"]] != self.backend:
                continue
            if row[col["svname"]] == self.server:
                server = row
            elif row[col["svname"]] == "BACKEND":
                # Requests with no server affinity wait in the backend's queue, not the
                # server's: both count as waiting for this server's slots.
                backend_queued = _int(row[col["qcur"]]) or 0
        if server is None:
            raise ActuatorError(
                f"HAProxy's `show stat` has no server {self.backend}/{self.server}: "
                "check the names with `show servers state`"
            )
        slim, scur, qcur = (_int(server[col[name]]) for name in ("slim", "scur", "qcur"))
        status = server[col["status"]]
        allowance = 0 if status.startswith("MAINT") else slim
        queued = (qcur or 0) + backend_queued
        return ReadBack(allowance, scur, queued, None, None, f"status {status}")

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification:
        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        """Nothing is held open: every command is its own connection."""


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


# -- a command ---------------------------------------------------------------------------
