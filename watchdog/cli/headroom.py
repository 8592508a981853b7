"""`llm-watchdog headroom`: per thermal state of this card, the batch concurrency chat holds at.

Reads the probes the daemon stored (with the batch requests in flight and the GPU sample each
was sent under) and prints `llm_watchdog.control.headroom`'s map; `status` shows the row of
the state the card is in now.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, overload

import click

from llm_watchdog.cli.group import cli, db_option, open_store, settings_from, window_args
from llm_watchdog.cli.output import emit, listing_options
from llm_watchdog.control.headroom import (
    AUTO,
    EXCEED_SHARE,
    MINUTE_ATTAINMENT,
    STATE_RULE,
    StateRow,
    describe,
    headroom_map,
    judged_per_minute,
    minute_share,
    observation_from,
    row_for,
    share_for,
    thermal_state,
)
from llm_watchdog.durations import human_ms, parse_duration
from llm_watchdog.store.control import steered_target_ms
from llm_watchdog.store.db import Store
from llm_watchdog.store.headroom import chat_rates_seen, probe_states, probes_without_load

DEFAULT_SINCE = "7d"


class TargetMs(click.ParamType):
    """A chat target in milliseconds: a duration with its unit (400ms, 1.5s), as `report
    --target` takes it, or a plain number, read as milliseconds."""

    name = "target"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            ms = float(value)
        else:
            text = str(value).strip()
            try:
                ms = float(text)
            except ValueError:
                try:
                    ms = parse_duration(text) * 1000.0
                except ValueError as exc:
                    self.fail(f"{exc}, or a plain number of milliseconds (400)")
        if not ms >= 1.0 or ms == float("inf"):
            self.fail(f"{value!r} is under 1 ms or not a finite time: give e.g. 400ms or 1.5s")
        return ms


class PerMinute(click.ParamType):
    """`--chat-per-minute`: "auto", or a count of chat answers a minute (0: the pooled p95)."""

    name = "auto|N"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | str:
        text = str(value).strip().lower()
        if text == AUTO:
            return AUTO
        try:
            n = int(text)
        except ValueError:
            n = -1
        if n < 0:
            self.fail(
                f"{value!r} is not auto or a count of chat answers a minute: give auto (the "
                "gateway's count), 0 (the pooled p95) or e.g. 24"
            )
        return n


def stored_map(
    store: Store,
    since_ts: float,
    target_ms: float,
    until_ts: float | None = None,
    share: float = EXCEED_SHARE,
) -> list[StateRow]:
    """The headroom map of the newest fingerprint's probes from `since_ts` to `until_ts`
    (None: now); a group holds with at most `share` of its probes over the target."""
    fp = store.latest_fingerprint()
    rows = probe_states(store, since_ts, fp["id"] if fp else None, until_ts)
    return headroom_map((observation_from(r) for r in rows), target_ms, share=share)


def chat_per_minute_seen(
    store: Store, since_ts: float, until_ts: float | None = None
) -> int | None:
    """Chat answers a minute over the span, from the usual rate the control loop recorded
    where the gateway counted chat (the median of its decisions'); None where none did."""
    rates = chat_rates_seen(store, since_ts, until_ts)
    if not rates:
        return None
    return max(1, round(statistics.median(rates) * 60.0))


def judging(
    store: Store, setting: int | str, since_ts: float, until_ts: float | None = None
) -> tuple[int, int | None]:
    """The chat answers a minute a map over the span is judged by (0: the pooled p95), from
    `control.chat_per_minute` or `--chat-per-minute`, and the gateway's count over the span
    (None where it counted none)."""
    seen = chat_per_minute_seen(store, since_ts, until_ts)
    return judged_per_minute(setting, seen), seen


def group_rule(share: float, per_minute: int, setting: int | str = 0) -> str:
    """How a group of probes is judged, in words, for the table's head: `per_minute` is what
    `setting` came to (`judging`)."""
    if per_minute == 0:
        why = (
            "the gateway counted no chat over this span; --chat-per-minute N judges it as the "
            "SLO's one-minute windows of N answers"
            if setting == AUTO
            else "--chat-per-minute judges it as the SLO's one-minute windows"
        )
        return (
            f"a group holds with at most {share * 100:.0f} % of its probes over the target "
            f"(its p95 within it, pooled: {why})"
        )
    whose = " (the gateway's count over this span)" if setting == AUTO else ""
    return (
        f"a group holds with at most {share * 100:.2f} % of its probes over the target: at "
        f"that share a minute of {per_minute} chat answers{whose} has its p95 within the target "
        f"in {MINUTE_ATTAINMENT * 100:.0f} % of minutes"
    )


@overload
def chosen_target(store: Store, given_ms: float | None, config_ms: float) -> tuple[float, str]: ...
@overload
def chosen_target(
    store: Store, given_ms: float | None, config_ms: float | None
) -> tuple[float | None, str]: ...
def chosen_target(
    store: Store, given_ms: float | None, config_ms: float | None
) -> tuple[float | None, str]:
    """The chat target a headroom map is judged against, and whose it is: `--target` where
    given, else the one the daemon steered by (its newest control decision records it; a
    database from another box or a demo says a target the local config may not), else the
    config's."""
    if given_ms is not None:
        return given_ms, "given"
    stored = steered_target_ms(store)
    if stored is not None:
        return stored, "the daemon's"
    return config_ms, "control.target_p95"


def current_state(store: Store) -> str | None:
    """The thermal state of the first GPU's newest sample (None: no sample)."""
    gpus = store.last_gpu_samples()
    if not gpus:
        return None
    g = gpus[0]
    return thermal_state(
        sm_clock_mhz=g.get("sm_clock_mhz"),
        sm_clock_max_mhz=g.get("sm_clock_max_mhz"),
        temp_c=g.get("temp_c"),
        temp_slowdown_c=g.get("temp_slowdown_c"),
        reasons=g.get("throttle_reasons"),
    )


def status_line(
    store: Store,
    config_ms: float,
    now_ts: float,
    given_ms: float | None = None,
    per_minute: int | str = AUTO,
) -> tuple[str, dict[str, Any]]:
    """The `status` row: the current state's headroom over the last 7 days, and the target
    it was judged against (`chosen_target`); groups judged by `per_minute`
    (`control.chat_per_minute`)."""
    since = now_ts - 7 * 86400.0
    target_ms, whose = chosen_target(store, given_ms, config_ms)
    state = current_state(store) or "no-gpu"
    share = share_for(judging(store, per_minute, since)[0])
    row = row_for(stored_map(store, since, target_ms, share=share), state)
    against = f"; against the {human_ms(target_ms)} target ({whose})"
    about = {"state": state, "target_ms": target_ms, "target_from": whose}
    if row is None:
        line = f"{state}: not enough data yet (no probes with batch in flight in this state)"
        return line + against, {**about, "row": None}
    return describe(row) + against, {**about, "row": row.to_dict()}


@cli.command()
@db_option
@click.option(
    "--since",
    default=DEFAULT_SINCE,
    show_default=True,
    help="Probes from this long ago (30m, 24h, 7d) or an ISO date.",
)
@click.option(
    "--target",
    "target_ms",
    type=TargetMs(),
    default=None,
    help="Chat p95 TTFT target: 400ms, 1.5s, or a plain number of ms (default: "
    "control.target_p95).",
)
@click.option("--until", default=None, help="Probes up to this time (default: now).")
@click.option(
    "--chat-per-minute",
    "per_minute",
    type=PerMinute(),
    default=None,
    help="Judge each group as the SLO does, by one-minute windows of this many chat answers "
    "(the minute's p95 within the target in 99 % of minutes): with few answers a minute that "
    "asks for far fewer slow ones than a pooled p95. auto: as many as the gateway counted "
    "over the span, the pooled p95 where it counted none. 0: the probes' pooled p95. "
    "Default: control.chat_per_minute (auto).",
)
@listing_options
@click.pass_context
def headroom(
    ctx: click.Context,
    since: str,
    until: str | None,
    target_ms: float | None,
    per_minute: int | str | None,
    fmt: str,
) -> None:
    """Per thermal state of the card: the batch concurrency that keeps chat p95 in target.

    --json gives one object per thermal state, --csv a row per state (its level groups as
    JSON in one cell)."""
    settings = settings_from(ctx)
    now = time.time()
    since_ts, until_ts = window_args(since, until, now)
    setting = settings.control.chat_per_minute if per_minute is None else per_minute
    with open_store(settings) as store:
        config_ms = settings.control.target_p95_s * 1000.0
        target, whose = chosen_target(store, target_ms, config_ms)
        judged, seen = judging(store, setting, since_ts, until_ts)
        share = share_for(judged)
        rows = stored_map(store, since_ts, target, until_ts, share)
        unloaded = probes_without_load(store, since_ts) if not rows else 0
        state = current_state(store)
    if fmt != "table":
        columns = [f.name for f in dataclasses.fields(StateRow)] + [
            "current",
            "target_ms",
            "exceed_share",
            "chat_per_minute",
            "chat_per_minute_seen",
        ]
        extra = {
            "target_ms": target,
            "exceed_share": share,
            "chat_per_minute": judged,
            "chat_per_minute_seen": seen,
        }
        listed = [{**r.to_dict(), "current": r.state == state, **extra} for r in rows]
        emit(listed, columns, fmt)
        return
    span = f"probes since {since}" + (f" until {until}" if until else "")
    click.echo(f"chat p95 TTFT target {target:,.0f} ms ({whose}); {span}")
    if not rows:
        why = (
            f"{unloaded} probes carry no batch in-flight count: turn the control loop on "
            "(control.enabled) so each probe records the batch load it was sent under"
            if unloaded
            else "no warm probes yet: run the daemon with control.enabled"
        )
        click.echo(f"not enough data yet: {why}")
        return
    click.echo(f"states: {STATE_RULE}")
    click.echo(f"groups: {group_rule(share, judged, setting)}")
    if seen is not None and judged == 0:
        click.echo(
            f"chat: about {seen} answers a minute over this span (the gateway's count); the "
            f"SLO's one-minute windows of that much chat allow {minute_share(seen) * 100:.2f} % "
            f"over the target, not 5 %: --chat-per-minute auto (control.chat_per_minute's "
            "default) judges by them"
        )
    click.echo("state   allowance  (confidence, probes, the bands of those probes)")
    for r in rows:
        mark = "  ← now" if r.state == state else ""
        click.echo(describe(r) + mark)
