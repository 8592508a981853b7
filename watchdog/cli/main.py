"""The `llm-watchdog` command line: a thin click layer over the library.

Exit codes: 0 ok, 1 failure, 2 usage, 78 configuration (sysexits EX_CONFIG).
Every error is one line on stderr that says what to do next.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import click
from llm_watchdog import __version__
from llm_watchdog.cli.output import emit, listing_options, stamp
from llm_watchdog.cli.timeargs import parse_when
from llm_watchdog.config import EX_CONFIG, ConfigError, Settings, example_config, load_settings

EXIT_FAILURE = 1


class Fail(click.ClickException):
    """A failure the user can act on: one line, exit 1."""

    exit_code = EXIT_FAILURE

    def show(self, file: Any = None) -> None:
        click.echo(f"llm-watchdog: {self.message}", err=True)


class ConfigFail(Fail):
    exit_code = EX_CONFIG


def settings_from(ctx: click.Context) -> Settings:
    obj = ctx.ensure_object(dict)
    if "settings" not in obj:
        try:
            obj["settings"] = load_settings(obj.get("config_path"))
        except ConfigError as exc:
            raise ConfigFail(str(exc)) from None
    return obj["settings"]


def when_arg(text: str | None, now: float) -> float | None:
    if text is None:
        return None
    try:
        return parse_when(text, now)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def open_store(settings: Settings, must_exist: bool = True) -> Any:
    from pathlib import Path

    from llm_watchdog.store.db import Store, StoreError

    path = Path(settings.storage.path)
    if must_exist and not path.exists():
        raise Fail(
            f"no database at {path}: start the daemon (`llm-watchdog run`) first, "
            "or point --config / storage.path at the right file"
        )
    try:
        return Store(path)
    except StoreError as exc:
        raise Fail(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    envvar="LLM_WATCHDOG_CONFIG",
    help="Config file (default /etc/llm-watchdog/config.toml; env LLM_WATCHDOG_CONFIG).",
)
@click.version_option(__version__, prog_name="llm-watchdog")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Keep chat fast on a GPU shared with a batch job."""
    ctx.ensure_object(dict)["config_path"] = config_path


# ---- check-config ---------------------------------------------------------------------------


@cli.command("check-config")
@click.option("--example", is_flag=True, help="Print a documented example config and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the effective settings as JSON.")
@click.pass_context
def check_config(ctx: click.Context, example: bool, as_json: bool) -> None:
    """Validate the config file and print the effective settings (secrets masked)."""
    if example:
        click.echo(example_config(), nl=False)
        return
    settings = settings_from(ctx)
    settings.api_key()  # a named secret that cannot be read is a config error too
    data = settings.to_dict()
    if as_json:
        click.echo(json.dumps({"source": settings.source, "settings": data}, indent=2))
        return
    click.echo(f"# effective settings from {settings.source}")
    for section, values in data.items():
        click.echo(f"\n[{section}]")
        for key, value in values.items():
            click.echo(f"{key} = {_toml_value(key, value)}")


def _toml_value(key: str, value: Any) -> str:
    from llm_watchdog.durations import format_duration

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and key not in ("seed",):
        return json.dumps(format_duration(value))
    return json.dumps(value)


# ---- probe ----------------------------------------------------------------------------------

PROBE_COLUMNS = [
    "prompt_id",
    "ok",
    "ttft_ms",
    "total_ms",
    "output_tokens",
    "quality_pass",
    "cache_bust",
    "connection",
    "answer",
    "error",
]


@cli.command()
@click.option("--url", help="Server base URL (default: server.url from the config).")
@click.option("--model", help="Model name (default: server.model; 'auto' asks the server).")
@click.option("--probe-set", help="Probe set name or path (default: probe.probe_set).")
@click.option("--cache-mode", type=click.Choice(["bust", "cached"]), help="Prompt-cache mode.")
@click.option("--api", type=click.Choice(["openai", "ollama"]), help="Wire protocol.")
@click.option(
    "--rounds",
    type=click.IntRange(1, 10000),
    default=1,
    show_default=True,
    help="How many times to run the whole probe set.",
)
@listing_options
@click.pass_context
def probe(
    ctx: click.Context,
    url: str | None,
    model: str | None,
    probe_set: str | None,
    cache_mode: str | None,
    api: str | None,
    rounds: int,
    fmt: str,
) -> None:
    """Send one round of the probe set to a server and print what each probe measured.

    Exits 1 when any probe failed or gave a wrong answer.
    """
    from dataclasses import replace

    from llm_watchdog.daemon.service import probe_options
    from llm_watchdog.probe.client import Prober

    settings = settings_from(ctx)
    server = replace(
        settings.server,
        url=url or settings.server.url,
        model=model or settings.server.model,
        api=api or settings.server.api,
    )
    probe_s = replace(
        settings.probe,
        probe_set=probe_set or settings.probe.probe_set,
        cache_mode=cache_mode or settings.probe.cache_mode,
    )
    settings = replace(settings, server=server, probe=probe_s)
    target = reach_server(settings)
    pset, api_key, info, chosen, engine = (
        target.probe_set,
        target.api_key,
        target.info,
        target.model,
        target.engine,
    )
    results = []
    with Prober(server.url, chosen, probe_options(settings, engine), api_key=api_key) as prober:
        for _ in range(rounds):
            for prompt in pset.prompts:
                results.append(prober.probe(prompt, pset.name))
    rows = [_probe_row(r) for r in results]
    if fmt == "table":
        click.echo(
            f"# {server.url}  model {chosen}  engine {info.engine} {info.version}  "
            f"probe set {pset.name}  cache {probe_s.cache_mode}",
            err=True,
        )
    emit(rows, PROBE_COLUMNS, fmt)
    failed = [r for r in results if not r.ok or r.quality_pass is False]
    if fmt == "table":
        ok_ttfts = sorted(r.ttft_ms for r in results if r.ok and r.ttft_ms is not None)
        if ok_ttfts:
            p50 = ok_ttfts[len(ok_ttfts) // 2]
            click.echo(
                f"# {len(results) - len(failed)}/{len(results)} passed; TTFT p50 {p50:.1f} ms",
                err=True,
            )
    if failed:
        sys.exit(EXIT_FAILURE)


@dataclass(frozen=True)
class Target:
    """A server the CLI is about to probe: reachable, with its model and engine known."""

    probe_set: Any
    api_key: str | None
    info: Any  # llm_watchdog.probe.engine.EngineInfo
    model: str
    engine: str


def reach_server(settings: Settings) -> Target:
    """Load the probe set, reach `server.url`, pick the model and engine; one-line errors."""
    from llm_watchdog.probe.engine import detect_engine
    from llm_watchdog.probe.sets import ProbeSetError, load_probe_set

    server = settings.server
    try:
        pset = load_probe_set(settings.probe.probe_set)
    except ProbeSetError as exc:
        raise Fail(str(exc)) from None
    api_key = _api_key(settings)
    info = detect_engine(server.url, api_key=api_key)
    if info.engine == "unreachable":
        raise Fail(_unreachable(server.url, info))
    model = server.model
    if model == "auto":
        if not info.models:
            raise Fail(f"{server.url} lists no models at /v1/models: pass --model NAME")
        model = info.models[0]
    engine = server.engine if server.engine != "auto" else info.engine
    return Target(pset, api_key, info, model, engine)


def _api_key(settings: Settings) -> str | None:
    try:
        return settings.api_key()
    except ConfigError as exc:
        raise ConfigFail(str(exc)) from None


def _unreachable(url: str, info: Any) -> str:
    detail = info.props.get("error") if isinstance(info.props, dict) else None
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return (
        f"cannot reach {url}"
        + (f" ({detail})" if detail else "")
        + f": is the server running? try `curl {base}/v1/models`"
    )


def _probe_row(r: Any) -> dict[str, Any]:
    d = r.to_dict()
    d["answer"] = (r.answer or "").strip().replace("\n", " ")[:40]
    d["error"] = r.error_detail if r.error_class else ""
    if r.error_class:
        d["error"] = f"{r.error_class}: {r.error_detail}"
    return d


# ---- run ------------------------------------------------------------------------------------


@cli.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the watchdog daemon in the foreground (what the systemd unit starts)."""
    from pathlib import Path

    from llm_watchdog.daemon.service import EXIT_STARTUP_FAILED, Daemon
    from llm_watchdog.logs import setup_logging
    from llm_watchdog.probe.sets import ProbeSetError

    settings = settings_from(ctx)
    setup_logging(settings.logging.level, settings.logging.format)
    _api_key(settings)
    Path(settings.storage.path).parent.mkdir(parents=True, exist_ok=True)
    store = open_store(settings, must_exist=False)
    from llm_watchdog.cli.judge import build_alerts

    alert_manager = build_alerts(settings, store)
    try:
        daemon = Daemon(settings, store, alerts=alert_manager)
    except ProbeSetError as exc:
        alert_manager.close(timeout_s=1.0)
        store.close()
        raise ConfigFail(str(exc)) from None
    daemon.install_signal_handlers()
    try:
        daemon.startup()
    except Exception as exc:
        click.echo(f"llm-watchdog: start-up failed: {exc}", err=True)
        daemon.shutdown(timeout_s=1.0)
        alert_manager.close(timeout_s=1.0)
        store.close()
        sys.exit(EXIT_STARTUP_FAILED)
    try:
        daemon.serve()
    finally:
        clean = daemon.shutdown(timeout_s=5.0)
        alert_manager.close(timeout_s=3.0)
        store.close()
        if not clean:
            click.echo(
                "llm-watchdog: a job was still running at shutdown; stopped anyway", err=True
            )
            # A probe blocked in a read would hold interpreter exit (the executor joins its
            # threads) until its own timeout; the store is closed, so nothing is lost.
            sys.stderr.flush()
            os._exit(0)


# ---- status / history -----------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON object.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Last probe, last GPU sample per GPU, the fingerprint, and the database path."""
    settings = settings_from(ctx)
    with open_store(settings) as store:
        last = store.last_probe()
        gpus = store.last_gpu_samples()
        fp = (
            store.fingerprint(last["fingerprint_id"])
            if last and last.get("fingerprint_id")
            else store.latest_fingerprint()
        )
        from llm_watchdog.store.records import active_baseline, events

        stored = active_baseline(store, fp["id"]) if fp else None
        baseline = stored.to_dict() if stored else None
        open_events = [e for e in events(store) if e["end_ts"] is None]
    data = {
        "database": settings.storage.path,
        "last_probe": last,
        "gpus": gpus,
        "fingerprint": fp,
        "baseline": baseline,
        "open_events": open_events,
    }
    if as_json:
        click.echo(json.dumps(data, default=str, indent=2))
        return
    click.echo(f"database     {settings.storage.path}")
    if last:
        verdict = "ok" if last["ok"] else f"FAILED ({last['error_class']})"
        ttft = f"{last['ttft_ms']:.1f} ms" if last.get("ttft_ms") is not None else "-"
        click.echo(
            f"last probe   {stamp(last['ts'])}  {last['prompt_id']}  {verdict}  "
            f"TTFT {ttft}{'  (cold)' if last.get('cold') else ''}"
        )
    else:
        click.echo("last probe   none yet")
    if not gpus:
        click.echo("gpu          no samples (latency-only mode or no GPU)")
    for g in gpus:
        from llm_watchdog.nvml.throttle import reason_names

        reasons = ",".join(reason_names(g.get("throttle_reasons") or 0)) or "none"
        click.echo(
            f"gpu {g['gpu_index']}        {stamp(g['ts'])}  {_f(g.get('temp_c'), '°C')}  "
            f"SM {_f(g.get('sm_clock_mhz'))}/{_f(g.get('sm_clock_max_mhz'))} MHz  "
            f"{_f(g.get('power_w'), 'W')}/{_f(g.get('power_limit_w'), 'W')}  "
            f"reasons {reasons}"
        )
    if fp:
        click.echo(
            f"fingerprint  {fp['id']}: {fp['engine']} {fp['engine_version']}, model "
            f"{fp['model']}, driver {fp['driver_version']}, GPU {fp['gpu_name']}"
        )
        click.echo(f"launch       {fp['launch_command']}")
    if baseline:
        click.echo(
            f"baseline     TTFT p50 {baseline['ttft_p50_ms']:.0f} ms, p95 "
            f"{baseline['ttft_p95_ms']:.0f} ms from {baseline['n']} probes "
            f"({baseline['source']}, {stamp(baseline['created_ts'])})"
        )
    else:
        click.echo("baseline     none yet (learned from the first warm probes)")
    for e in open_events:
        click.echo(f"OPEN {e['kind']:<8} since {stamp(e['start_ts'])}: {e['message']}")


def _f(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.0f}{' ' + unit if unit else ''}"


HISTORY_COLUMNS = [
    "time",
    "prompt_id",
    "ok",
    "cold",
    "ttft_ms",
    "total_ms",
    "output_tokens",
    "quality_pass",
    "error_class",
]
GPU_COLUMNS = [
    "time",
    "gpu_index",
    "temp_c",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "power_w",
    "power_limit_w",
    "util_gpu_pct",
    "throttle_reasons",
    "reasons",
]
CONTROL_COLUMNS = [
    "time",
    "kind",
    "allowance_before",
    "allowance_after",
    "p95_est_ms",
    "applied",
    "verify_kind",
    "reason",
]
BUCKET_COLUMNS = [
    "time",
    "span_s",
    "n",
    "ok_n",
    "cold_n",
    "quality_fail_n",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_max_ms",
    "errors",
]


@cli.command()
@click.option(
    "--since",
    default="24h",
    show_default=True,
    help="Start: a duration back (30m, 24h, 7d) or an ISO date.",
)
@click.option("--until", help="End (default now): a duration back or an ISO date.")
@click.option("--gpu", "gpu", is_flag=True, help="GPU samples instead of probes.")
@click.option(
    "--control",
    "control",
    is_flag=True,
    help="Batch-allowance decisions (with reason and verification) instead.",
)
@click.option(
    "--resolution",
    type=click.Choice(["auto", "raw", "1m", "1h"]),
    default="auto",
    show_default=True,
    help="raw rows, or 1-minute / 1-hour buckets; auto: raw up to 2 days, then "
    "1m up to 60 days, then 1h.",
)
@click.option("--limit", type=click.IntRange(1), help="At most this many rows (newest).")
@click.option(
    "--export-trace",
    "export_to",
    metavar="FILE",
    help="Write the probes as a replay trace CSV (- for stdout) instead of listing them.",
)
@listing_options
@click.pass_context
def history(
    ctx: click.Context,
    since: str,
    until: str | None,
    gpu: bool,
    control: bool,
    resolution: str,
    limit: int | None,
    export_to: str | None,
    fmt: str,
) -> None:
    """Probe results (or GPU samples) over a time range, oldest first."""
    from llm_watchdog.nvml.throttle import reason_names
    from llm_watchdog.store.db import AUTO_1M_MAX_S, AUTO_RAW_MAX_S, GPU_HISTORY_COLUMNS

    settings = settings_from(ctx)
    now = time.time()
    since_ts, until_ts = when_arg(since, now), when_arg(until, now)
    assert since_ts is not None
    if control:
        with open_store(settings) as store:
            rows = store.rows(
                "SELECT * FROM control_actions WHERE ts >= ? AND ts < ? ORDER BY ts, id",
                (since_ts, until_ts if until_ts is not None else float("inf")),
            )
        for r in rows[-limit:] if limit else rows:
            r["time"] = stamp(r["ts"]) if fmt == "table" else r["ts"]
        emit(rows[-limit:] if limit else rows, CONTROL_COLUMNS, fmt)
        return
    if export_to:
        from llm_watchdog.cli.judge import export_trace_to

        export_trace_to(settings, export_to, since_ts, until_ts)
        return
    if resolution == "auto":
        length = (until_ts or now) - since_ts
        resolution = (
            "raw" if length <= AUTO_RAW_MAX_S else "1m" if length <= AUTO_1M_MAX_S else "1h"
        )
    with open_store(settings) as store:
        if resolution == "raw":
            rows = (
                store.gpu_samples(since_ts, until_ts) if gpu else store.probes(since_ts, until_ts)
            )
            columns = GPU_COLUMNS if gpu else HISTORY_COLUMNS
        else:
            rows = store.history(since_ts, until_ts, resolution, series="gpu" if gpu else "probes")
            columns = ["time", *GPU_HISTORY_COLUMNS[1:], "reasons"] if gpu else BUCKET_COLUMNS
    if limit:
        rows = rows[-limit:]
    for r in rows:
        r["time"] = stamp(r["ts"]) if fmt == "table" else r["ts"]
        if gpu:
            r["reasons"] = ",".join(reason_names(r.get("throttle_reasons") or 0))
    emit(rows, columns, fmt)


def _register_commands() -> None:
    # The judging side's commands live in their own module; importing it adds them to `cli`.
    import llm_watchdog.cli.judge  # noqa: F401
    import llm_watchdog.cli.lab  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    _register_commands()
    cli.main(args=argv, prog_name="llm-watchdog", obj={})


# ---- install --------------------------------------------------------------------------------


@cli.command()
@click.option("--user", "user_unit", is_flag=True, help="Install a systemd user unit instead.")
@click.option(
    "--gateway",
    "with_gateway",
    is_flag=True,
    help="Also install the gateway's unit, its settings file and a control token.",
)
@click.option("--no-start", is_flag=True, help="Write the files; do not enable or start.")
@click.option("--dry-run", is_flag=True, help="Print what would be written and run.")
@click.option(
    "--root",
    default="/",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Install under another root (packaging, tests); implies --no-start.",
)
def install(user_unit: bool, with_gateway: bool, no_start: bool, dry_run: bool, root: str) -> None:
    """Install the systemd service (and a config to edit, if there is none) and start it."""
    from pathlib import Path

    from llm_watchdog.daemon.install import apply, plan_install

    rooted = Path(root).resolve() != Path("/")
    plan = plan_install(
        Path(root), user=user_unit, start=not (no_start or rooted), gateway=with_gateway
    )
    if dry_run:
        click.echo(f"# {plan.unit_path}\n{plan.unit_text}")
        for path, text in plan.units.items():
            click.echo(f"# {path}\n{text}")
        if plan.write_config:
            click.echo(
                f"# {plan.config_path}: the example config (llm-watchdog check-config --example)"
            )
        for cmd in plan.commands:
            click.echo("$ " + " ".join(cmd))
        return
    try:
        for line in apply(plan, run_systemctl=not rooted):
            click.echo(line)
    except PermissionError as exc:
        raise Fail(f"cannot write {exc.filename}: run as root (sudo), or use --user") from None
    except (RuntimeError, OSError) as exc:
        raise Fail(str(exc)) from None
    except Exception as exc:  # subprocess.CalledProcessError from systemctl
        raise Fail(f"{exc}; see `journalctl -u llm-watchdog` for why") from None
