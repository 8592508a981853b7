"""`llm-watchdog probe`: one round of the probe set against a server, measured."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import click

from llm_watchdog.cli.group import (
    EXIT_FAILURE,
    cli,
    reach_server,
    settings_from,
)
from llm_watchdog.cli.output import emit, listing_options
from llm_watchdog.cli.urlargs import SERVER_URL
from llm_watchdog.daemon.service import probe_options
from llm_watchdog.drift import classify_cold
from llm_watchdog.probe.client import Prober

# ---- probe ----------------------------------------------------------------------------------

PROBE_COLUMNS = [
    "prompt_id",
    "ok",
    "cold",
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
@click.option(
    "--url", type=SERVER_URL, help="Server base URL (default: server.url from the config)."
)
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

    `cold` marks what the daemon would count as a cold start, not steady-state chat: the
    probes before the server's first answer, and any that timed a model load (Ollama).
    Exits 1 when any probe failed or gave a wrong answer.
    """

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
    last_ok_ts: float | None = None
    with Prober(server.url, chosen, probe_options(settings, engine), api_key=api_key) as prober:
        for _ in range(rounds):
            for prompt in pset.prompts:
                result = prober.probe(prompt, pset.name)
                # The daemon's rule (Daemon.probe_once): until a probe has been answered the
                # engine has not shown it is warm, so the first one may time a model load.
                cold = classify_cold(
                    ts=result.ts,
                    previous_ts=last_ok_ts,
                    load_duration_ms=result.load_duration_ms,
                    idle_after_s=settings.drift.cold_after_idle_s,
                ).cold
                if result.ok:
                    last_ok_ts = result.ts
                results.append(replace(result, cold=cold))
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


def _probe_row(r: Any) -> dict[str, Any]:
    d = r.to_dict()
    d["answer"] = (r.answer or "").strip().replace("\n", " ")[:40]
    d["error"] = r.error_detail if r.error_class else ""
    if r.error_class:
        d["error"] = f"{r.error_class}: {r.error_detail}"
    return d
