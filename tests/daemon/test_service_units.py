"""The units `install` writes, checked with the real tools and run as systemd would run them.

systemd is not PID 1 in a test, so: `systemd-analyze verify` and `security --offline=yes`
judge the generated unit files, and each unit's ExecStart runs under `setpriv` as a fresh
uid with no capabilities (what DynamicUser= gives), with its EnvironmentFile= read, a
credentials folder laid out as systemd lays it out for LoadCredential= ($CREDENTIALS_DIRECTORY:
mode 0500, files 0400, owned by the service's uid), and a NOTIFY_SOCKET the test binds.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import llm_watchdog
from llm_watchdog.daemon.install import GATEWAY_UNIT, SYSTEM_DB, UNIT_NAME, apply, plan_install
from llm_watchdog.store.db import Store
from tests.helpers.llamacpp import free_port
from tests.helpers.notify import NotifySocket
from tests.helpers.streamserver import StreamServer

ANALYZE = shutil.which("systemd-analyze")
SETPRIV = shutil.which("setpriv")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze missing: install Debian's systemd (.ci/run does)"
)
needs_setpriv = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0,
    reason="running a unit as a fresh uid needs root and setpriv (util-linux)",
)
# Where llm_watchdog is imported from here, so the service finds the same code.
IMPORT_ROOT = str(Path(llm_watchdog.__file__).parent.parent)


@pytest.fixture
def root() -> Iterator[Path]:
    """An install root every uid can walk (pytest's tmp_path is root-only, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="llm-watchdog-units-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def installed(root: Path) -> dict[str, str]:
    apply(plan_install(root, gateway=True, start=False), run_systemctl=False)
    units = root / "etc/systemd/system"
    return {name: (units / name).read_text() for name in (UNIT_NAME, GATEWAY_UNIT)}


@needs_analyze
def test_the_generated_units_verify(root):
    installed(root)
    units = sorted(str(p) for p in (root / "etc/systemd/system").glob("*.service"))
    done = subprocess.run(
        [ANALYZE, "verify", *units], capture_output=True, text=True, cwd=root, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # Other units of the machine may draw remarks of their own; ours draw none.
    ours = [line for line in done.stderr.splitlines() if "llm-watchdog" in line]
    assert ours == [], done.stderr


@needs_analyze
@pytest.mark.parametrize("name", [UNIT_NAME, GATEWAY_UNIT])
def test_the_generated_units_score_3_or_less(root, name):
    installed(root)
    unit = root / "etc/systemd/system" / name
    done = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--threshold=30", str(unit)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", done.stdout)
    assert m is not None, done.stdout[-500:]
    assert float(m.group(1)) <= 3.0


def test_the_units_keep_what_nvml_and_the_gateway_need(root):
    units = installed(root)
    daemon, gateway = units[UNIT_NAME], units[GATEWAY_UNIT]
    for text in units.values():
        assert "Type=notify" in text and re.search(r"^WatchdogSec=\d+s$", text, re.M)
        assert "\nCapabilityBoundingSet=\n" in text
        assert "SystemCallFilter=@system-service" in text
        assert "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK" in text
        assert "MemoryDenyWriteExecute=yes" in text and "ExecReload=" in text
        assert "LoadCredential=control-token:/etc/llm-watchdog/credentials/control-token" in text
    # NVML opens its character devices: named, not hidden behind PrivateDevices=.
    assert "\nPrivateDevices=" not in daemon and "DevicePolicy=closed" in daemon
    assert "DeviceAllow=/dev/nvidiactl rw" in daemon
    assert "DeviceAllow=char-nvidia-frontend rw" in daemon  # /dev/nvidia[0-9]*
    assert "DeviceAllow=char-nvidia-uvm rw" in daemon  # /dev/nvidia-uvm*
    assert "LimitNOFILE=65536" in gateway and "PrivateDevices=yes" in gateway


def _fresh_uid() -> int:
    for uid in range(61184, 65519):  # systemd's DynamicUser= range
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no free uid in 61184-65519")


def _unit_value(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key] = value
    return out


class Service:
    """One unit's ExecStart as systemd would start it: fresh uid, credentials, notify socket."""

    def __init__(self, root: Path, name: str, unit: str, uid: int, env: dict[str, str]):
        self.notify = NotifySocket(root / f"notify-{name}")
        creds = root / "run/credentials" / name
        creds.mkdir(parents=True)
        for spec in _unit_value(unit, "LoadCredential"):
            cred, _, source = spec.partition(":")
            target = creds / cred
            shutil.copyfile(root / source.lstrip("/"), target)
            os.chown(target, uid, uid)
            target.chmod(0o400)
        os.chown(creds, uid, uid)
        creds.chmod(0o500)
        environment = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": "/",
            "PYTHONPATH": IMPORT_ROOT,
            "PYTHONDONTWRITEBYTECODE": "1",
            "CREDENTIALS_DIRECTORY": str(creds),
            "NOTIFY_SOCKET": self.notify.address,
            "WATCHDOG_USEC": "1000000",
        }
        for spec in _unit_value(unit, "Environment"):
            key, _, value = spec.partition("=")
            environment[key] = value
        for spec in _unit_value(unit, "EnvironmentFile"):
            path = root / spec.lstrip("-").lstrip("/")
            if path.exists():
                environment.update(_env_file(path))
        for spec in _unit_value(unit, "StateDirectory"):
            state = root / "var/lib" / spec
            state.mkdir(parents=True)
            os.chown(state, uid, uid)
            environment["STATE_DIRECTORY"] = str(state)
            # The installed config names the database in this folder as systemd makes it;
            # here the folder lives under the test's root.
            assert SYSTEM_DB == f"/var/lib/{spec}/watchdog.db"
            environment["LLM_WATCHDOG__STORAGE__PATH"] = str(state / "watchdog.db")
        environment.update(env)
        (exec_start,) = _unit_value(unit, "ExecStart")
        argv = [
            str(root / a.lstrip("/")) if a.startswith("/etc/llm-watchdog/") else a
            for a in shlex.split(exec_start)
        ]
        self.argv = argv
        self.proc = subprocess.Popen(
            [
                SETPRIV or "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--no-new-privs",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
                *argv,
            ],
            env=environment,
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ready(self, timeout_s: float = 60.0) -> dict[str, str]:
        try:
            return self.notify.wait_for("READY", timeout_s=timeout_s)
        except AssertionError:
            self.stop()
            raise AssertionError(f"{self.argv} not ready; stderr:\n{self.stderr}") from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.stderr = self.proc.communicate(timeout=20)[1]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stderr = self.proc.communicate()[1]
        self.notify.close()
        return self.proc.returncode

    stderr = ""


@needs_setpriv
def test_both_units_start_as_a_fresh_uid_with_credentials_and_notify(root):
    units = installed(root)
    uid = _fresh_uid()
    token = (root / "etc/llm-watchdog/credentials/control-token").read_text().strip()
    gw_port = free_port()
    gw_url = f"http://127.0.0.1:{gw_port}"
    with StreamServer(answer="Paris", engine="vllm", version="0.6.0") as engine:
        gateway = Service(
            root,
            GATEWAY_UNIT,
            units[GATEWAY_UNIT],
            uid,
            {
                "LLM_WATCHDOG_GATEWAY_LISTEN": f"127.0.0.1:{gw_port}",
                "LLM_WATCHDOG_GATEWAY_UPSTREAM": engine.url,
            },
        )
        daemon: Service | None = None
        try:
            assert gateway.ready()["STATUS"] == f"listening on port {gw_port}"
            daemon = Service(
                root,
                UNIT_NAME,
                units[UNIT_NAME],
                uid,
                {
                    "LLM_WATCHDOG__SERVER__URL": gw_url,
                    "LLM_WATCHDOG__PROBE__INTERVAL": "1s",
                    "LLM_WATCHDOG__PROBE__JITTER": "0s",
                    "LLM_WATCHDOG__GPU__ENABLED": "false",
                    "LLM_WATCHDOG__API__LISTEN": '""',
                    "LLM_WATCHDOG__CONTROL__ENABLED": "true",
                    "LLM_WATCHDOG__CONTROL__GATEWAY_URL": gw_url,
                },
            )
            status = daemon.ready()["STATUS"]
            assert f"watching {gw_url}; last probe ok" in status
            # The daemon's control loop writes with the token it got as a credential.
            deadline = time.monotonic() + 30
            batch: dict = {}
            while time.monotonic() < deadline:
                batch = httpx.get(f"{gw_url}/control").json()["classes"]["batch"]
                if batch.get("lease_expires_at"):
                    break
                time.sleep(0.2)
            assert batch.get("lease_expires_at"), batch
            assert (
                httpx.put(
                    f"{gw_url}/control/classes/batch",
                    json={"allowance": 3},
                    headers={"Authorization": f"Bearer {token}"},
                ).status_code
                == 200
            )
            # Both ping systemd's watchdog (WATCHDOG_USEC=1 s: every 0.5 s).
            for service in (gateway, daemon):
                service.notify.wait_for("WATCHDOG", timeout_s=10)
            # SIGHUP reloads, and systemd hears RELOADING=1 then READY=1 again.
            for service in (gateway, daemon):
                service.proc.send_signal(signal.SIGHUP)
                service.notify.wait_for("RELOADING", timeout_s=20)
            time.sleep(1.0)
            assert gateway.proc.poll() is None and daemon.proc.poll() is None
        finally:
            codes = [s.stop() for s in (daemon, gateway) if s is not None]
    assert codes == [0, 0], (daemon.stderr if daemon else "") + gateway.stderr
    assert "config reloaded from" in (daemon.stderr if daemon else "")
    assert "reloaded: control token set" in gateway.stderr
    for service in (gateway, daemon):
        assert service is not None and service.notify.count("STOPPING") == 1
    assert "Traceback" not in gateway.stderr + (daemon.stderr if daemon else "")
    # The fingerprint says where its launch command came from: the daemon asked the gateway,
    # and the gateway (another uid than the engine's) says why it could not read it.
    with Store(root / "var/lib/llm-watchdog/watchdog.db") as store:
        fp = store.latest_fingerprint()
    assert fp["engine"] == "vllm" and fp["launch_command"] == "unknown"
    assert fp["extra"]["launch_command_source"].startswith("gateway: unreadable: ")


@needs_setpriv
def test_a_root_only_token_file_is_one_line_and_exit_78_not_a_loop(root):
    installed(root)
    uid = _fresh_uid()
    token_file = root / "etc/llm-watchdog/credentials/control-token"
    done = subprocess.run(
        [
            SETPRIV or "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--",
            sys.executable,
            "-m",
            "llm_watchdog",
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            str(token_file),
        ],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": IMPORT_ROOT, "HOME": "/"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 78, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Permission denied" in lines[0] and "credentials" in lines[0]
