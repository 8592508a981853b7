"""Finding the process behind a listening port through /proc: a real one, and made-up tables."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_watchdog.probe.procinfo import listening_process_cmdline, on_this_machine
from llm_watchdog.urls import is_loopback_host

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")

# Binds, prints the port, and waits for stdin to close: the test owns its whole lifetime.
SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
s.close()
"""


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[tuple[int, list[str]]]:
    argv = [sys.executable, "-c", SERVER, request.param, "--marker", "llm-watchdog test"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield port, argv
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.parametrize("server", ["127.0.0.1"], indirect=True)
def test_finds_the_command_line_of_a_real_listener(server: tuple[int, list[str]]) -> None:
    port, argv = server
    assert listening_process_cmdline(port) == argv
    assert listening_process_cmdline(port, "localhost") == argv
    assert listening_process_cmdline(port, "::1") is None  # nothing on IPv6 loopback


@pytest.mark.parametrize("server", ["0.0.0.0"], indirect=True)
def test_a_wildcard_listener_serves_loopback(server: tuple[int, list[str]]) -> None:
    port, argv = server
    assert listening_process_cmdline(port, "127.0.0.1") == argv
    assert listening_process_cmdline(port, "192.0.2.1") is None  # TEST-NET-1: not this host


def test_a_bound_socket_that_does_not_listen_is_nobody() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert listening_process_cmdline(s.getsockname()[1]) is None


def test_no_proc_means_none(tmp_path: Path) -> None:
    assert listening_process_cmdline(8080, proc=tmp_path) is None
    assert listening_process_cmdline(8080, host="no-such-host.invalid", proc=tmp_path) is None


def _hex4(addr: str) -> str:
    """An IPv4 address as /proc/net/tcp prints it: one 32-bit word in host byte order."""
    return f"{struct.unpack('=I', socket.inet_pton(socket.AF_INET, addr))[0]:08X}"


def _hex6(addr: str) -> str:
    raw = socket.inet_pton(socket.AF_INET6, addr)
    return "".join(f"{w:08X}" for w in struct.unpack("=4I", raw))


def _fake_proc(tmp_path: Path, tcp: list[str], tcp6: list[str], pids: dict[int, int]) -> Path:
    header = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
        "   uid  timeout inode\n"
    )
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(header + "\n".join(tcp) + "\n")
    (tmp_path / "net" / "tcp6").write_text(header + "\n".join(tcp6) + "\n")
    for pid, inode in pids.items():
        (tmp_path / str(pid) / "fd").mkdir(parents=True)
        os.symlink("/dev/null", tmp_path / str(pid) / "fd" / "0")
        os.symlink(f"socket:[{inode}]", tmp_path / str(pid) / "fd" / "5")
        (tmp_path / str(pid) / "cmdline").write_bytes(
            b"llama-server\0-m\0m.gguf\0--pid\0%d\0" % pid
        )
    return tmp_path


def _line(local: str, port: int, state: str, inode: int) -> str:
    rem = "0" * len(local)
    return (
        f"   0: {local}:{port:04X} {rem}:0000 {state} 00000000:00000000 00:00000000 00000000"
        f"  1000        0 {inode} 1 0000000000000000 100 0 0 10 0"
    )


def test_reads_ipv6_tables_and_takes_the_parent_of_forked_workers(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        tcp=[_line(_hex4("127.0.0.1"), 9000, "01", 11)],  # an established connection, not LISTEN
        tcp6=[_line(_hex6("::1"), 9000, "0A", 22), _line(_hex6("::"), 9100, "0A", 33)],
        pids={4321: 22, 1234: 22, 77: 11, 500: 33},
    )
    assert listening_process_cmdline(9000, "::1", proc) == [
        "llama-server",
        "-m",
        "m.gguf",
        "--pid",
        "1234",
    ]
    assert listening_process_cmdline(9000, "127.0.0.1", proc) is None
    # "::" is dual-stack by default, so it serves IPv4 loopback too.
    assert listening_process_cmdline(9100, "127.0.0.1", proc) == [
        "llama-server",
        "-m",
        "m.gguf",
        "--pid",
        "500",
    ]


def test_ipv4_mapped_listener_and_unreadable_cmdline(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        tcp=["garbage line", _line("XYZ", 1, "0A", 5)],
        tcp6=[_line(_hex6("::ffff:127.0.0.1"), 7000, "0A", 44)],
        pids={42: 44},
    )
    assert listening_process_cmdline(7000, "127.0.0.1", proc) == [
        "llama-server",
        "-m",
        "m.gguf",
        "--pid",
        "42",
    ]
    (proc / "42" / "cmdline").unlink()
    assert listening_process_cmdline(7000, "127.0.0.1", proc) is None


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST.",
        "app.localhost",
        "127.0.0.1",
        "127.0.0.2",
        "::1",
        "[::1]",
        "0:0:0:0:0:0:0:1",
        "::ffff:127.0.0.1",
    ],
)
def test_loopback_hosts_in_every_spelling(host: str) -> None:
    assert is_loopback_host(host)
    assert on_this_machine(host)


@pytest.mark.parametrize(
    "host",
    [
        "",
        None,
        "0.0.0.0",
        "::",
        "192.0.2.1",
        "10.0.0.1",
        "gpu-box",
        "localhost.example.com",
        "128.0.0.1",
    ],
)
def test_other_hosts_are_not_loopback(host: str | None) -> None:
    assert not is_loopback_host(host)


def test_this_machines_own_names_and_addresses_are_on_it_without_asking_dns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_dns(*args: object, **kwargs: object) -> None:
        raise AssertionError("a name was looked up")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(socket, "gethostbyname", no_dns)
    assert on_this_machine(socket.gethostname())
    assert on_this_machine(socket.gethostname().upper())
    assert not on_this_machine("gpu-box.example.com")
    assert not on_this_machine("192.0.2.1")  # TEST-NET-1: no interface holds it
    assert not on_this_machine("[2001:db8::1]")


def _own_address() -> str | None:
    """This machine's address on its default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@pytest.mark.parametrize("server", ["0.0.0.0"], indirect=True)
def test_an_engine_named_by_this_machines_own_address_is_read_as_local(
    server: tuple[int, list[str]],
) -> None:
    """A server.url with the machine's LAN address, not 127.0.0.1, still names a local engine:
    its command line is read, as the fingerprint's launch command needs."""
    from llm_watchdog.cli.bench import _launch_command

    own = _own_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    port, argv = server
    assert on_this_machine(own)
    assert _launch_command(f"http://{own}:{port}", "auto", identity=None) == argv


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize("server", ["::1"], indirect=True)
def test_localhost_finds_an_engine_that_listens_on_ipv6_loopback_only(
    server: tuple[int, list[str]],
) -> None:
    from llm_watchdog.cli.bench import _launch_command

    port, argv = server
    assert listening_process_cmdline(port, "localhost") == argv
    assert _launch_command(f"http://localhost:{port}", "auto", identity=None) == argv
