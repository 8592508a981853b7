from __future__ import annotations

import numpy as np

from llm_watchdog.bench.compare import compare_runs, differences, flags

CMD = "llama-server --model m.gguf --host 127.0.0.1 --port 8001 --parallel 4 --metrics"


def run(**changes):
    base = {
        "id": 1,
        "complete": True,
        "engine": "llamacpp",
        "engine_version": "b1",
        "model": "m",
        "launch_command": CMD,
        "driver_version": "550",
        "gpu_name": "RTX",
        "probe_set_hash": "p",
        "batch_set_hash": "b",
        "config": {"duration_s": 20, "levels": [0, 2]},
        "levels": [
            {"batch_streams": 0, "quality_pass_rate": 1.0, "chat_p95_ms": 100.0},
            {"batch_streams": 2, "quality_pass_rate": 1.0, "chat_p95_ms": 300.0},
        ],
    }
    base.update(changes)
    return base


def rows(level_index, values, quality=True):
    return [
        {"level_index": level_index, "outcome": "ok", "quality_pass": quality, "ttft_ms": v}
        for v in values
    ]


def test_flags_reads_a_launch_command_word_by_word():
    f = flags(CMD + " -c=4096 --flash-attn")
    assert f["--parallel"] == "4" and f["--metrics"] == "" and f["arg0"] == "llama-server"
    assert f["--flash-attn"] == ""


def test_only_the_changed_flag_is_named_not_the_port():
    b = run(launch_command=CMD.replace("--parallel 4", "--parallel 2").replace("8001", "8002"))
    assert differences(run(), b) == [{"variable": "launch command --parallel", "a": "4", "b": "2"}]


def test_more_than_one_change_warns():
    b = run(engine_version="b2", config={"duration_s": 30, "levels": [0, 2]})
    out = compare_runs(run(), b, [], [])
    names = [d["variable"] for d in out["differences"]]
    assert names == ["engine version", "config duration_s"]
    assert any("2 variables differ" in w for w in out["warnings"])


def test_per_level_verdict_and_a_quality_drop_first():
    rng = np.random.default_rng(3)
    a_rows = rows(0, rng.normal(100, 5, 100)) + rows(1, rng.normal(300, 10, 100))
    b_rows = rows(0, rng.normal(100, 5, 100)) + rows(1, rng.normal(200, 10, 100))
    levels_b = [
        {"batch_streams": 0, "quality_pass_rate": 1.0},
        {"batch_streams": 2, "quality_pass_rate": 0.8},
    ]
    out = compare_runs(run(), run(id=2, levels=levels_b), a_rows, b_rows)
    by = {lv["batch_streams"]: lv for lv in out["levels"]}
    assert by[0]["verdict"] == "no difference shown"
    assert by[2]["verdict"] == "faster" and by[2]["chat_p95_diff_high_ms"] < 0
    assert len(out["quality_drops"]) == 1 and "batch 2" in out["quality_drops"][0]
    assert any("nothing differs" in w for w in out["warnings"])


def test_a_level_with_few_probes_gets_a_warning():
    out = compare_runs(run(), run(id=2), rows(0, [100.0] * 30), rows(0, [120.0] * 30))
    assert any("fewer than 50 right answers at batch 0" in w for w in out["warnings"])
    out = compare_runs(run(), run(id=2), rows(0, [100.0] * 10), rows(0, [120.0] * 10))
    assert any("fewer than 20 right answers at batch 0" in w for w in out["warnings"])


def test_scheduler_lines_say_what_the_engine_queue_did_or_that_it_said_nothing():
    la = [{"batch_streams": 4, "engine_queue_ms_mean": 900.0, "quality_pass_rate": 1.0}]
    lb = [{"batch_streams": 4, "engine_queue_ms_mean": 120.0, "quality_pass_rate": 1.0}]
    out = compare_runs(run(levels=la), run(id=2, levels=lb), [], [])
    assert out["scheduler"] == ["batch 4: requests waited 900 ms in the engine's queue in A, "
                                "120 ms in B"]  # fmt: skip
    out = compare_runs(run(), run(id=2), [], [])
    assert "cannot be seen" in out["scheduler"][0]
