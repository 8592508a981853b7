"""The CLI as a user meets it: exit codes, one-line errors, listings."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result
from tests.helpers.fakenvml import scenario_basic
from tests.helpers.streamserver import StreamServer, closed_port_url


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env or {}, obj={})


def test_probe_against_a_local_server_passes_and_prints_a_row_per_prompt():
    with StreamServer(answer="Paris Tokyo 7 4") as srv:
        out = invoke("probe", "--url", srv.url, "--json")
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]
    assert len(rows) == 5 and all(r["ok"] and r["quality_pass"] for r in rows)


def test_probe_exits_1_when_an_answer_is_wrong():
    with StreamServer(answer="I do not know") as srv:
        out = invoke("probe", "--url", srv.url, "--json")
    assert out.exit_code == 1


def test_unreachable_server_is_one_line_naming_the_url():
    url = closed_port_url()
    out = invoke("probe", "--url", url)
    assert out.exit_code == 1
    assert out.output.count("\n") == 1
    assert f"cannot reach {url}" in out.output and "curl" in out.output


def test_bad_config_exits_78_with_the_file_and_key(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[probe]\ninterval = 'often'\n")
    out = invoke("--config", str(cfg), "check-config")
    assert out.exit_code == 78
    assert str(cfg) in out.output and "[probe] interval" in out.output


def test_usage_error_exits_2():
    assert invoke("history", "--since", "last tuesday").exit_code == 2
    assert invoke("no-such-command").exit_code == 2


def test_check_config_masks_secrets(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[alerts.sink]]\ntype = "webhook"\nurl = "https://hooks.example/T0/SECRET"\n')
    out = invoke("--config", str(cfg), "check-config", "--json")
    assert out.exit_code == 0, out.output
    assert "SECRET" not in out.output and "***" in out.output


def test_status_and_history_read_what_the_daemon_wrote(db_path):
    with StreamServer(answer="Paris", engine="llamacpp") as srv:
        settings = settings_from_dict(
            {"server": {"url": srv.url}, "storage": {"path": str(db_path)}}, "t"
        )
        with Store(db_path) as store:
            daemon = Daemon(settings, store, nvml=scenario_basic())
            daemon.startup()
            try:
                daemon.sample_gpu()
                for _ in range(3):
                    daemon.probe_once()
            finally:
                daemon.shutdown(timeout_s=2)
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
    out = invoke("status", env=env)
    assert out.exit_code == 0, out.output
    assert "last probe" in out.output and "llamacpp" in out.output and "gpu 0" in out.output
    assert "baseline     none yet" in out.output
    out = invoke("history", "--since", "1h", "--csv", env=env)
    lines = out.output.splitlines()
    assert lines[0].startswith("time,prompt_id,ok,cold,ttft_ms") and len(lines) == 4
    out = invoke("history", "--since", "1h", "--gpu", "--json", env=env)
    assert len(out.output.splitlines()) == 2  # two GPUs, one sample each
    out = invoke("history", "--since", "3d", "--resolution", "1m", "--json", env=env)
    buckets = [json.loads(line) for line in out.output.splitlines()]
    assert sum(b["n"] for b in buckets) == 3


def test_history_shows_the_batch_each_probe_ran_beside(db_path):
    now = time.time()
    with Store(db_path) as store:
        store.record_probe(probe_result(now - 20, batch_inflight=None, batch_allowance=None), None)
        store.record_probe(probe_result(now - 10, batch_inflight=7, batch_allowance=8), None)
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
    out = invoke("history", "--since", "1h", "--json", env=env)
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [(r["batch_inflight"], r["batch_allowance"]) for r in rows] == [(None, None), (7, 8)]
    table = invoke("history", "--since", "1h", env=env).output.splitlines()
    assert "batch_inflight  batch_allowance" in table[0]


def test_status_without_a_database_says_what_to_do(tmp_path):
    out = invoke("status", env={"LLM_WATCHDOG__STORAGE__PATH": str(tmp_path / "none.db")})
    assert out.exit_code == 1 and "llm-watchdog run" in out.output


def test_a_database_this_user_may_not_read_is_one_line_naming_sudo(tmp_path, monkeypatch):
    # The service's database sits in a 0700 folder of its own; the tests run as root, who
    # reads everything, so the folder's refusal is what Path.exists meets for another user.
    import pathlib

    db = tmp_path / "private" / "watchdog.db"
    real_exists = pathlib.Path.exists

    def exists(self, *args, **kwargs):
        if self == db:
            raise PermissionError(13, "Permission denied", str(db))
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "exists", exists)
    out = invoke("status", env={"LLM_WATCHDOG__STORAGE__PATH": str(db)})
    assert out.exit_code == 1, out.output
    assert "permission denied" in out.output and "sudo" in out.output
    assert len(out.output.strip().splitlines()) == 1 and "Traceback" not in out.output


def test_a_minute_split_by_a_runtime_change_says_which_runtime_each_row_is(db_path):
    import time

    from llm_watchdog.probe.fingerprint import build_fingerprint
    from tests.helpers.builders import probe_result

    minute = (int(time.time()) // 60 - 5) * 60.0
    with Store(db_path) as store:
        ids = []
        for model in ("qwen", "llama"):
            fp = build_fingerprint(
                engine="vllm",
                engine_version="0.6",
                model=model,
                launch_command=None,
                driver_version=None,
                gpu_name=None,
                gpu_uuid=None,
                probe_set_hash="x",
                config_hash=None,
            )
            ids.append(store.record_fingerprint(fp))
        store.record_probe(probe_result(minute + 10, ttft_ms=100.0), ids[0])
        store.record_probe(probe_result(minute + 40, ttft_ms=300.0), ids[1])
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
    out = invoke("history", "--since", "1h", "--resolution", "1m", env=env)
    assert out.exit_code == 0, out.output
    header, *rows = out.output.splitlines()
    assert header.split()[:2] == ["time", "fingerprint"]
    assert len(rows) == 2 and rows[0].split()[:2] == rows[1].split()[:2]  # the same minute
    assert [r.split()[2] for r in rows] == [ids[0][:12], ids[1][:12]]
