"""Which local process listens on a TCP port, and with what command line (Linux /proc).

Used for the fingerprint's launch command in `auto` mode: the engine's own argv says which
model file, context size and batch settings produced the numbers.

How (proc(5)): `/proc/net/tcp` and `/proc/net/tcp6` list sockets with their local address,
state (0A = LISTEN, include/net/tcp_states.h) and inode; `/proc/PID/fd/*` links read
`socket:[INODE]`; `/proc/PID/cmdline` is argv separated by NUL bytes. Another user's fds are
unreadable without privileges, so a server run by another user gives None, as do a machine
without /proc and a port nobody listens on. Nothing here raises for those.
`launch_command` says which of these it was (the fingerprint's `launch_command_source`),
and can ask systemd for the ExecStart of the engine's own unit instead.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from llm_watchdog.urls import is_loopback_host

_LISTEN = "0A"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


# Why no command line could be read, as launch_command_source says it.
NO_LISTENER = "unreadable: no local process listens on the port"
OTHER_USER = (
    "unreadable: the listening process belongs to another user or /proc is mounted "
    "hidepid; set server.engine_unit or server.launch_command"
)


def launch_command(
    port: int | None,
    host: str,
    *,
    engine_unit: str = "",
    proc: str | Path = "/proc",
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> tuple[list[str] | None, str]:
    """The engine's argv and where it came from ("process", "systemd unit vllm.service", or
    "unreadable: why")."""
    why = NO_LISTENER
    if port is not None:
        argv, why = _listening(port, host, Path(proc))
        if argv is not None:
            return argv, "process"
    if engine_unit:
        argv, unit_why = unit_exec_start(engine_unit, run=run)
        if argv is not None:
            return argv, f"systemd unit {engine_unit}"
        why = f"{why}; {unit_why}"
    return None, why


_ARGV = re.compile(r"argv\[\]=(.*?) ; ")


def unit_exec_start(
    unit: str, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> tuple[list[str] | None, str]:
    """ExecStart of a systemd unit (`systemctl show -p ExecStart --value`), as argv."""
    try:
        done = run(
            ["systemctl", "show", "-p", "ExecStart", "--value", "--", unit],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"systemctl show {unit} failed ({exc})"
    m = _ARGV.search(done.stdout or "")
    if done.returncode != 0 or m is None or not m.group(1).strip():
        reason = (done.stderr or "").strip().splitlines()[:1] or ["no ExecStart"]
        return None, f"unit {unit}: {reason[0]}"
    # systemctl prints argv joined by spaces; an argument with spaces cannot be told apart.
    return m.group(1).split(), f"systemd unit {unit}"


def listening_process_cmdline(
    port: int, host: str = "127.0.0.1", proc: str | Path = "/proc"
) -> list[str] | None:
    """argv of the local process listening on `host`:`port`, or None when it cannot be told.

    A listener on the wildcard address (0.0.0.0, ::) counts when `host` is one of this
    machine's addresses. When several processes share the socket (a server that forks
    workers), the lowest PID, usually the parent, is taken.
    """
    return _listening(port, host, Path(proc))[0]


def listening_pid(port: int, host: str = "127.0.0.1", proc: str | Path = "/proc") -> int | None:
    """PID of the local process listening on `host`:`port` (the lowest, as above), or None."""
    proc = Path(proc)
    inodes = _listener_inodes(port, host, proc)
    return _owner(proc, inodes) if inodes else None


def process_tree(pid: int, proc: str | Path = "/proc") -> set[int]:
    """`pid` and every process below it (an engine's tensor-parallel workers are children)."""
    parents: dict[int, int] = {}
    for entry in Path(proc).iterdir() if Path(proc).is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # proc(5): "pid (comm) state ppid ...", comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 2 and fields[1].isdigit():
            parents[int(entry.name)] = int(fields[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return tree


def _listener_inodes(port: int, host: str, proc: Path) -> set[int]:
    """Socket inodes of the LISTEN sockets on `host`:`port` (see `listening_pid`)."""
    targets = _addresses(host)
    if not targets:
        return set()
    inodes = set()
    for name, width in (("tcp", 8), ("tcp6", 32)):
        for addr, lport, inode in _listeners(proc / "net" / name, width):
            if lport == port and _matches(addr, targets):
                inodes.add(inode)
    inodes.discard(0)
    return inodes


def _listening(port: int, host: str, proc: Path) -> tuple[list[str] | None, str]:
    inodes = _listener_inodes(port, host, proc)
    if not inodes:
        return None, NO_LISTENER
    pid = _owner(proc, inodes)
    if pid is None:
        return None, OTHER_USER
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None, OTHER_USER
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")]
    if argv and argv[-1] == "":
        argv.pop()
    return (argv, "process") if argv else (None, OTHER_USER)


def _listeners(table: Path, width: int) -> list[tuple[IPAddress, int, int]]:
    """(local address, port, inode) of every LISTEN socket in a /proc/net/tcp* table."""
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return []
    out = []
    for line in lines:
        cols = line.split()
        if len(cols) < 10 or cols[3] != _LISTEN:
            continue
        hex_addr, _, hex_port = cols[1].partition(":")
        try:
            addr = _parse_addr(hex_addr, width)
            out.append((addr, int(hex_port, 16), int(cols[9])))
        except ValueError:
            continue
    return out


def _parse_addr(hex_addr: str, width: int) -> IPAddress:
    """The kernel prints the address as 32-bit words in host byte order (`%08X` of a
    __be32 read as a native int, net/ipv4/tcp_ipv4.c, net/ipv6/tcp_ipv6.c)."""
    if len(hex_addr) != width:
        raise ValueError(hex_addr)
    words = [int(hex_addr[i : i + 8], 16) for i in range(0, width, 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    if width == 8:
        return ipaddress.IPv4Address(packed)
    v6 = ipaddress.IPv6Address(packed)
    return v6.ipv4_mapped or v6


def _addresses(host: str) -> set[IPAddress]:
    """The addresses `host` stands for (a literal, "localhost", or a name)."""
    host = host.strip("[]")
    if host == "localhost":
        return {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    out: set[IPAddress] = set()
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
            addr = addr.ipv4_mapped
        out.add(addr)
    return out


def _matches(listen: IPAddress, targets: set[IPAddress]) -> bool:
    if listen in targets:
        return True
    if not listen.is_unspecified:
        return False
    # A wildcard listener serves every local address of its family; "::" also serves IPv4
    # unless the socket is IPV6_V6ONLY, which /proc does not show (the default is dual-stack,
    # net.ipv6.bindv6only = 0).
    return any(
        _is_local(t) and (t.version == listen.version or listen.version == 6) for t in targets
    )


def on_this_machine(host: str) -> bool:
    """Whether `host` (from a URL) names this machine, so its listeners can be read here: the
    loopback, one of this machine's own addresses, or its own host name. Other names are not
    looked up: DNS can hang, and the caller asks again every minute."""
    if is_loopback_host(host):
        return True
    name = host.strip("[]").rstrip(".")
    try:
        addr = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return bool(name) and name.lower() == socket.gethostname().lower()
    return _is_local(addr)


def _is_local(addr: IPAddress) -> bool:
    """Whether the address belongs to this machine: binding to it succeeds only if it does."""
    if addr.is_loopback:
        return True
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((str(addr), 0))
        return True
    except OSError:
        return False


def _owner(proc: Path, inodes: set[int]) -> int | None:
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    except OSError:
        return None
    for pid in pids:
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # another user's process, or gone
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in wanted:
                    return pid
            except OSError:
                continue
    return None
