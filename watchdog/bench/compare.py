"""`bench compare A B`: what differs between two stored runs, and what it did. Pure.

Every variable that differs is listed (the target the run was made against, the launch
command flag by flag, engine version, driver, model, probe set, batch set, GPU, the bench's
settings key by key): a comparison
is only readable when one thing changed, so more than one gets a warning. Then per batch
level: the chat p95 difference (B - A) with a bootstrap 95 % interval over the raw TTFTs
and a plain verdict, and the quality and throughput differences. A quality drop comes
first: a faster setup that changes answers is a different system, not a faster one. A level
with fewer right answers on either side than an interval needs (`stats.MIN_INTERVAL_VALUES`)
gets no interval and the verdict "too few probes"; below MIN_PROBES it gets a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from llm_watchdog.bench.stats import min_values, percentile_difference, verdict
from llm_watchdog.probe.fingerprint import flags

FIELDS = (
    ("engine", "engine"),
    ("engine_version", "engine version"),
    ("model", "model"),
    ("driver_version", "driver"),
    ("gpu_name", "GPU"),
    ("probe_set_hash", "probe set"),
    ("batch_set_hash", "batch set"),
)
# Below this many right answers a level's p95 is close to its maximum and the bootstrap
# interval is too narrow: 10 % false "faster"/"slower" verdicts at 20 probes, none seen from
# 50 up (tests/benchmarks/bench_bench_power.py, docs/bench.md). Below
# stats.MIN_INTERVAL_VALUES (20) there is no verdict at all.
MIN_PROBES = 50
# Words of a launch command that say where it listens, not how it runs: two launches on
# different ports are the same setup.
ADDRESS_FLAGS = ("--port", "--host", "-p")
# What a run stores (in its config) about the path to the engine: "gateway" (an llm-watchdog
# gateway, whose engine is `engine_url`) or "direct"; where the engine's queue figures were
# read. They make up the "target" variable, not settings of the bench; a run stored before
# them has none, and its target is its URL alone.
VIA_GATEWAY, VIA_DIRECT = "gateway", "direct"
TARGET_CONFIG_KEYS = ("via", "engine_url", "metrics_url")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _host(url: Any) -> str:
    host = (urlsplit(str(url or "").strip()).hostname or "").lower()
    return "127.0.0.1" if host == "localhost" else host


def endpoint(url: Any) -> str | None:
    """Where a URL goes: scheme, host and port (the scheme's default filled in, `localhost`
    read as 127.0.0.1) and the path less a trailing `/v1`; None for none given."""
    if not url:
        return None
    parts = urlsplit(str(url).strip())
    host = _host(url)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # a port that is not a number: the URL as written is all there is
        return str(url).strip().rstrip("/")
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}{path}"


def _via(run: Mapping[str, Any]) -> Any:
    return (run.get("config") or {}).get("via")


def target_label(run: Mapping[str, Any]) -> str | None:
    """A run's target as `differences` shows it: its URL, and the engine behind a gateway."""
    url = run.get("url")
    if _via(run) == VIA_GATEWAY:
        engine_url = (run.get("config") or {}).get("engine_url") or "an engine it did not name"
        return f"{url} (llm-watchdog gateway to {engine_url})"
    return None if url is None else str(url)


def target_differs(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two runs reached their engine by different paths. A different host or port is
    a different path (a gateway in front of the engine, another machine), and so is a gateway
    in one run and none in the other. Two runs straight at an engine on one host that differ
    only in its port are the same path: the port is where the engine listens (ADDRESS_FLAGS
    in its launch command); that is known only where both runs stored how they went."""
    via_a, via_b = _via(a), _via(b)
    if via_a and via_b and via_a != via_b:
        return True
    if endpoint(a.get("url")) == endpoint(b.get("url")):
        return False
    return not (via_a == via_b == VIA_DIRECT and _host(a.get("url")) == _host(b.get("url")))


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One {"variable", "a", "b"} per thing that differs between two runs."""
    out: list[dict[str, Any]] = []
    if target_differs(a, b):
        out.append({"variable": "target", "a": target_label(a), "b": target_label(b)})
    ca, cb = str(a.get("launch_command", "unknown")), str(b.get("launch_command", "unknown"))
    if ca != cb:
        fa, fb = flags(ca), flags(cb)
        if ca == "unknown" or cb == "unknown":
            out.append({"variable": "launch command", "a": ca, "b": cb})
        else:
            for key in sorted(set(fa) | set(fb), key=lambda k: (k.startswith("arg"), k)):
                if key in ADDRESS_FLAGS or fa.get(key) == fb.get(key):
                    continue
                out.append(
                    {"variable": f"launch command {key}", "a": fa.get(key), "b": fb.get(key)}
                )
    for field, label in FIELDS:
        if a.get(field) != b.get(field):
            out.append({"variable": label, "a": a.get(field), "b": b.get(field)})
    conf_a, conf_b = _flatten(a.get("config") or {}), _flatten(b.get("config") or {})
    for key in sorted((set(conf_a) | set(conf_b)) - set(TARGET_CONFIG_KEYS)):
        if conf_a.get(key) != conf_b.get(key):
            out.append({"variable": f"config {key}", "a": conf_a.get(key), "b": conf_b.get(key)})
    return out


def _ttfts(rows: Sequence[Mapping[str, Any]], level_index: int) -> list[float]:
    return [
        float(r["ttft_ms"])
        for r in rows
        if r.get("level_index") == level_index
        and r.get("outcome") == "ok"
        and r.get("quality_pass")
        and r.get("ttft_ms") is not None
    ]


def _minus(b: Any, a: Any) -> float | None:
    return float(b) - float(a) if a is not None and b is not None else None


def compare_runs(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    chat_a: Sequence[Mapping[str, Any]],
    chat_b: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The comparison of run B against run A (the raw chat rows of each, as stored)."""
    diffs = differences(a, b)
    warnings: list[str] = []
    if len(diffs) > 1:
        warnings.append(
            f"{len(diffs)} variables differ: a difference below cannot be put down to any "
            "one of them; change one thing at a time"
        )
    elif not diffs:
        warnings.append("nothing differs between the runs: what follows is run-to-run noise")
    for run, name in ((a, "A"), (b, "B")):
        if not run.get("complete"):
            warnings.append(f"run {name} (#{run.get('id')}) is incomplete")
    index_a = {lv["batch_streams"]: i for i, lv in enumerate(a.get("levels") or [])}
    index_b = {lv["batch_streams"]: i for i, lv in enumerate(b.get("levels") or [])}
    levels: list[dict[str, Any]] = []
    quality_drops: list[str] = []
    short: list[int] = []
    too_few: list[str] = []
    for streams in sorted(set(index_a) & set(index_b)):
        la, lb = a["levels"][index_a[streams]], b["levels"][index_b[streams]]
        ta, tb = _ttfts(chat_a, index_a[streams]), _ttfts(chat_b, index_b[streams])
        diff = percentile_difference(ta, tb, 95)
        if diff is not None and min(len(ta), len(tb)) < min_values(95):
            too_few.append(f"{streams} (A {len(ta)}, B {len(tb)})")
        elif diff is not None and min(len(ta), len(tb)) < MIN_PROBES:
            short.append(streams)
        qa, qb = la.get("quality_pass_rate"), lb.get("quality_pass_rate")
        row = {
            "batch_streams": streams,
            "quality_a": qa,
            "quality_b": qb,
            "quality_diff": _minus(qb, qa),
            "chat_p95_a_ms": la.get("chat_p95_ms"),
            "chat_p95_b_ms": lb.get("chat_p95_ms"),
            "chat_p95_diff_ms": diff.value if diff else None,
            "chat_p95_diff_low_ms": diff.low if diff else None,
            "chat_p95_diff_high_ms": diff.high if diff else None,
            "verdict": verdict(diff),
            # The right answers behind each p95: the verdict needs min_values(95) a side.
            "probes_a": len(ta),
            "probes_b": len(tb),
            "batch_output_a_per_s": la.get("batch_output_per_s"),
            "batch_output_b_per_s": lb.get("batch_output_per_s"),
            "batch_output_unit": lb.get("batch_output_unit") or la.get("batch_output_unit"),
            "engine_queue_a_ms": la.get("engine_queue_ms_mean"),
            "engine_queue_b_ms": lb.get("engine_queue_ms_mean"),
            # The per-class view: chat's own median wait in the engine's queue (None where
            # the engine gave no per-request timings).
            "chat_engine_wait_a_ms": la.get("chat_engine_wait_p50_ms"),
            "chat_engine_wait_b_ms": lb.get("chat_engine_wait_p50_ms"),
            "chat_engine_wait_diff_ms": _minus(
                lb.get("chat_engine_wait_p50_ms"), la.get("chat_engine_wait_p50_ms")
            ),
        }
        if qa is not None and qb is not None and qb < qa:
            quality_drops.append(
                f"quality dropped at batch {streams}: {qa:.0%} -> {qb:.0%} of answers right; "
                "B answers differently, so its speed is not comparable"
            )
        levels.append(row)
    if too_few:
        warnings.append(
            f"fewer than {min_values(95)} right answers at batch "
            + ", ".join(too_few)
            + ": too few probes for a p95 interval, so no verdict; run longer levels "
            f"(--duration), at least {MIN_PROBES} right answers a level"
        )
    if short:
        warnings.append(
            f"fewer than {MIN_PROBES} right answers at batch "
            + ", ".join(str(s) for s in short)
            + ": a p95 from so few is near the maximum and its verdict is not reliable; "
            "run longer levels"
        )
    missing = sorted(set(index_a) ^ set(index_b))
    if missing:
        warnings.append(
            "batch levels measured in only one run: " + ", ".join(str(m) for m in missing)
        )
    return {
        "scheduler": _scheduler_lines(levels),
        "a": a.get("id"),
        "b": b.get("id"),
        "quality_drops": quality_drops,
        "differences": diffs,
        "warnings": warnings,
        "levels": levels,
    }


def _scheduler_lines(levels: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the engine's queue did, A against B: whether a priority or class setting
    changed the scheduler, not only the flag."""
    out = []
    for lv in levels:
        qa, qb = lv.get("engine_queue_a_ms"), lv.get("engine_queue_b_ms")
        if qa is not None and qb is not None:
            out.append(
                f"batch {lv['batch_streams']}: requests waited {qa:.0f} ms in the engine's "
                f"queue in A, {qb:.0f} ms in B"
            )
        ca, cb = lv.get("chat_engine_wait_a_ms"), lv.get("chat_engine_wait_b_ms")
        if ca is not None and cb is not None:
            out.append(
                f"batch {lv['batch_streams']}: chat requests waited {ca:.0f} ms (median) in "
                f"the engine's queue in A, {cb:.0f} ms in B ({cb - ca:+.0f} ms)"
            )
    if levels and not out:
        out.append(
            "the engine reported no queue time in at least one run: whether a priority or class "
            "setting changed its scheduler cannot be seen from its metrics"
        )
    return out
