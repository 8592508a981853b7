"""SIGHUP reloads the config in the daemon and the gateway: a bad one is refused with one
line and the running one kept; neither process dies of the signal (exit 129 once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

import llm_watchdog
from tests.helpers.llamacpp import free_port
from tests.helpers.notify import NotifySocket
from tests.helpers.streamserver import StreamServer

IMPORT_ROOT = str(Path(llm_watchdog.__file__).parent.parent)


def _env(ns: NotifySocket) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_WATCHDOG")}
    env.update({"PYTHONPATH": IMPORT_ROOT, "NOTIFY_SOCKET": ns.address})
    return env


def _wait_ready(ns: NotifySocket, n: int, proc: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 60
    while ns.count("READY") < n:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"READY #{n} not sent; got {ns.all()}"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=30)[1]
    return proc.returncode, err


def test_the_daemon_refuses_a_bad_config_on_sighup_and_takes_a_good_one(tmp_path):
    config = tmp_path / "config.toml"

    def write(interval: str) -> None:
        config.write_text(
            f'[server]\nurl = "{srv.url}"\n[probe]\ninterval = {interval}\njitter = "0s"\n'
            f'[gpu]\nenabled = false\n[api]\nlisten = ""\n'
            f'[storage]\npath = "{tmp_path / "db.sqlite"}"\n'
        )

    with StreamServer(answer="Paris") as srv, NotifySocket(tmp_path / "notify") as ns:
        write('"1s"')
        proc = subprocess.Popen(
            [sys.executable, "-m", "llm_watchdog", "--config", str(config), "run"],
            env=_env(ns),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_ready(ns, 1, proc)
            write("nan")
            proc.send_signal(signal.SIGHUP)
            _wait_ready(ns, 2, proc)  # refused: READY again with the running config
            write('"2s"')
            proc.send_signal(signal.SIGHUP)
            _wait_ready(ns, 3, proc)  # accepted: the jobs start over with it
        finally:
            code, err = _stop(proc)
    assert code == 0, err
    assert ns.count("RELOADING") == 2 and ns.count("STOPPING") == 1
    refused = [line for line in err.splitlines() if "config reload refused" in line]
    assert len(refused) == 1 and "expected a finite duration" in refused[0]
    assert "config reloaded from" in err and "Traceback" not in err
    assert "probe every 2.0s" in err


def test_the_gateway_rereads_its_token_on_sighup_and_keeps_it_when_unreadable(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def put(token: str) -> int:
        return httpx.put(
            f"{url}/control/classes/batch",
            json={"allowance": 2},
            headers={"Authorization": f"Bearer {token}"},
        ).status_code

    with StreamServer() as srv, NotifySocket(tmp_path / "notify") as ns:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llm_watchdog",
                "gateway",
                "--listen",
                f"127.0.0.1:{port}",
                "--upstream",
                srv.url,
                "--token-file",
                str(token_file),
            ],
            env=_env(ns),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_ready(ns, 1, proc)
            assert put("first-token") == 200
            token_file.write_text("second-token\n")
            proc.send_signal(signal.SIGHUP)
            _wait_ready(ns, 2, proc)
            assert put("second-token") == 200 and put("first-token") == 401
            token_file.unlink()
            proc.send_signal(signal.SIGHUP)
            _wait_ready(ns, 3, proc)
            assert put("second-token") == 200  # the running token is kept
        finally:
            code, err = _stop(proc)
    assert code == 0, err
    assert ns.count("STOPPING") == 1
    refused = [line for line in err.splitlines() if "reload refused" in line]
    assert len(refused) == 1 and "cannot read control token file" in refused[0]
