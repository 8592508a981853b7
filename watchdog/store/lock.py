"""One writer per database: an OS lock on a file beside it (`<database>.lock`).

`fcntl.flock` on an open descriptor: the kernel drops it when the process ends, SIGKILL
included, so a crash never leaves a stale lock behind and no pid has to be checked for
liveness. The holder writes its pid into the file, for the message the second one prints.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from llm_watchdog.errors import StorageError


class DatabaseInUse(StorageError):
    """Another process holds the database's writer lock. str(err) is one line."""

    def __init__(self, message: str, holder_pid: int | None) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


def lock_path(db_path: str | Path) -> Path:
    return Path(f"{db_path}.lock")


class WriterLock:
    """Held from `acquire()` to `release()` (or the end of the process)."""

    def __init__(self, db_path: str | Path) -> None:
        self.db_path = str(db_path)
        self.path = lock_path(db_path)
        self._fd: int | None = None

    def acquire(self) -> WriterLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageError(
                f"cannot create the lock file {self.path} ({exc.strerror or exc}): the "
                "database's folder must be writable by the daemon; check its owner and mode"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(
                    f"cannot lock {self.path} ({exc.strerror or exc}); is the file system "
                    "one that supports locks (not NFS without lockd)?"
                ) from None
            who = f"pid {holder}" if holder else "another process"
            raise DatabaseInUse(
                f"database {self.db_path} is in use by another llm-watchdog ({who}, lock "
                f"{self.path}): stop that one first, or give this one its own storage.path",
                holder,
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            # The file stays: deleting it would let a third process lock a new inode while
            # a second still waits on the old one.
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
