"""sd_notify(3) in pure Python: READY=1, STATUS=, WATCHDOG=1 and STOPPING=1 to systemd.

systemd hands a Type=notify service the path of an AF_UNIX datagram socket in
$NOTIFY_SOCKET (a leading "@" names an abstract socket) and, with WatchdogSec=, the
interval in $WATCHDOG_USEC (and the PID it is meant for in $WATCHDOG_PID). Outside systemd
there is no socket and every call does nothing, so the daemon and the gateway run the same
way under any supervisor.

`Heartbeat` sends WATCHDOG=1 at half the interval, as sd_watchdog_enabled(3) advises, but
only while the caller says its work moves (`beat()`): a wedged loop stops the pings and
systemd restarts the service.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("llm_watchdog.daemon.notify")


class Notifier:
    """Messages to systemd's notify socket; a no-op where there is none."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET") or None
        self.watchdog_usec = _watchdog_usec(env)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Send `fields` (e.g. "READY=1", "STATUS=probing") as one datagram; True if sent."""
        if self.address is None:
            return False
        # An abstract socket's name starts with a NUL byte; systemd writes it as "@".
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        payload = "\n".join(f.replace("\n", " ") for f in fields).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sock.setblocking(False)
                self._sock.sendto(payload, target)
                return True
            except OSError as exc:
                if not self._warned:  # a lost socket must not flood the log every ping
                    log.warning("cannot notify systemd at %s: %s", self.address, exc)
                    self._warned = True
                return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def reloading(self) -> bool:
        return self.send("RELOADING=1", "STATUS=reloading the config")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    """systemd's watchdog interval in µs if it is meant for this process (sd_watchdog_enabled)."""
    raw = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not raw.isdigit() or int(raw) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(raw)


class Heartbeat:
    """WATCHDOG=1 at half of systemd's interval, sent only while `beat()` keeps being called.

    The caller calls `beat()` each time its work completes a step (a scheduler job that
    finished). A ping goes out when a beat came since the last ping, or within `stale_s`
    of the last beat: work that finishes every 10 s keeps a 5 s ping going, and work that
    stopped finishing stops it.
    """

    def __init__(
        self,
        notifier: Notifier,
        *,
        stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        self.stale_s = stale_s
        self.clock = clock
        self.interval_s = (
            notifier.watchdog_usec / 2e6 if notifier.watchdog_usec is not None else None
        )
        self._last_beat = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pings = 0

    def beat(self) -> None:
        self._last_beat = self.clock()

    def due(self) -> bool:
        """Whether the work moved recently enough to vouch for the process."""
        return self.clock() - self._last_beat <= self.stale_s

    def tick(self) -> bool:
        """One ping if the work is alive; True if sent."""
        if not self.due():
            return False
        if self.notifier.send("WATCHDOG=1"):
            self.pings += 1
            return True
        return False

    def start(self) -> Heartbeat:
        """Ping from a thread of its own; a second call does nothing."""
        if self._thread is not None or self.interval_s is None or not self.notifier.enabled:
            return self
        interval = self.interval_s

        def loop() -> None:
            while not self._stop.wait(interval):
                if not self.tick():
                    log.debug("no watchdog ping: no job finished for %.0f s", self.stale_s)

        self._thread = threading.Thread(target=loop, name="llm-watchdog-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None
