from __future__ import annotations

from llm_watchdog.bench.run import Progress
from llm_watchdog.cli.bench import _Display


def test_a_terminal_gets_one_line_rewritten_in_place(capsys):
    d = _Display(tty=True)
    d.progress(Progress(0, 4, 12.4, 30, 812.0))
    d.progress(Progress(0, 4, 11.0, 31, 820.0))
    d.level_done({"batch_streams": 4, "chat_p95_ms": 820.0, "quality_pass_rate": 1.0,
                  "batch_output_per_s": 33.0, "batch_output_unit": "tokens"})  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\r") >= 3 and "\n" in err
    assert "batch 4: 12 s left, 30 probes, p95 812 ms" in err
    assert err.rstrip().endswith("# batch 4: chat p95 820 ms, quality 100%, batch 33 tokens/s")


def test_a_log_gets_plain_lines_at_most_every_ten_seconds(capsys):
    d = _Display(tty=False)
    for n in range(50):
        d.progress(Progress(1, 2, 60.0 - n, n + 1, None))
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == ["# batch 2: 60 s left, 1 probes, p95 -"]
