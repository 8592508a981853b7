"""Headroom: per thermal state of the card, the batch concurrency that keeps chat p95 in target.

Pure: observations in (one per stored probe, or one per one-minute window of a lab run), a
map out. A state is a band of the SM clock ratio and the temperature, with the throttle
reason bits (`thermal_state`). Within a state, observations are grouped by how many batch
requests were in flight (`LEVELS`); a group holds when at most 5 % of its chat TTFTs are over
the target (its p95 is within it). A state's answer is the top of the highest group below
the first that does not hold.

How sure an answer is comes from a binomial reading of each group (see `_verdict`); where
there are too few observations the row says so, and which observations would settle it.
docs/control.md has the bands and the figures behind them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from llm_watchdog.nvml.thresholds import throttle_onset
from llm_watchdog.nvml.throttle import THERMAL_MASK, is_idle
from llm_watchdog.stats import binom_sf, normal_cdf, quantile

STATES = ("cool", "warm", "hot", "no-gpu")
# Bands (docs/control.md): a clock under 90 % of its maximum, or a thermal slowdown bit, is
# hot; under 97 %, or within 15 °C of where slowdown begins (the throttle onset: the lowest
# of the target temperature, GPU_MAX and SLOWDOWN), is warm. A power-cap bit alone
# is not a state: prefill spikes flick it on a cool card, and a cap that holds the clock down
# shows in the clock.
HOT_CLOCK_RATIO = 0.90
WARM_CLOCK_RATIO = 0.97
WARM_MARGIN_C = 15.0
DEFAULT_SLOWDOWN_C = 90.0
# Batch-in-flight groups (lo, hi): one per count up to 4, then wider as counts grow.
LEVELS: tuple[tuple[int, int], ...] = (
    (0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 6), (7, 8), (9, 12), (13, 16), (17, 24),
    (25, 32), (33, 48), (49, 64), (65, 96), (97, 128), (129, 1 << 30),
)  # fmt: skip
MIN_GROUP = 20  # observations a group needs before it says anything
EXCEED_SHARE = 0.05  # p95 within target: at most this share over it
MINUTE_ATTAINMENT = 0.99  # the SLO: chat p95 within target in this share of one-minute windows
SURE_RISK = 0.10  # a verdict is "sure" when the other reading has under this probability


def thermal_state(
    *,
    sm_clock_mhz: float | None,
    sm_clock_max_mhz: float | None,
    temp_c: float | None,
    temp_slowdown_c: float | None,
    reasons: int | None,
) -> str:
    """cool, warm, hot, or no-gpu where there is no telemetry.

    An idle card's clock is low without heat: with the GpuIdle bit and no throttle bit its
    clock is not read as a state.
    """
    if temp_c is None and sm_clock_mhz is None:
        return "no-gpu"
    bits = reasons or 0
    if bits & THERMAL_MASK:
        return "hot"
    ratio = clock_ratio(sm_clock_mhz, sm_clock_max_mhz, bits)
    if ratio is not None and ratio < HOT_CLOCK_RATIO:
        return "hot"
    slowdown = temp_slowdown_c or DEFAULT_SLOWDOWN_C
    if (ratio is not None and ratio < WARM_CLOCK_RATIO) or (
        temp_c is not None and temp_c >= slowdown - WARM_MARGIN_C
    ):
        return "warm"
    return "cool"


def clock_ratio(
    sm_clock_mhz: float | None, sm_clock_max_mhz: float | None, reasons: int | None
) -> float | None:
    """The SM clock as a share of its maximum, as a thermal state reads it: None for an idle
    card (the GpuIdle bit), whose clock sits at its floor whatever the heat. A hot card
    idling keeps its thermal bit, and that bit, not the floor, makes its state hot."""
    if sm_clock_mhz is None or not sm_clock_max_mhz or is_idle(reasons):
        return None
    return sm_clock_mhz / sm_clock_max_mhz


@dataclass(frozen=True)
class Observation:
    """One chat measurement with the load and the card's state it was made under."""

    ttft_ms: float
    batch_inflight: int
    state: str
    temp_c: float | None = None
    clock_ratio: float | None = None
    chat_per_s: float | None = None  # chat's arrival rate around it; None: not known


@dataclass(frozen=True)
class Group:
    lo: int  # batch in flight, inclusive
    hi: int
    n: int
    over: int  # observations over the target
    p95_ms: float
    verdict: str  # holds | fails | unsure (too few to tell)
    sure: bool


@dataclass(frozen=True)
class StateRow:
    state: str
    n: int  # observations in this state
    allowance: int | None  # batch in flight chat holds at; None: not enough data yet
    bound: str  # "exact", "at least" (nothing above was seen failing), "none"
    confidence: str  # sure | likely | not enough data
    settle: str  # what data would settle it ("" once sure)
    unit: str = "probes"  # what n counts: probes, or one-minute windows in the lab
    temp_c_min: float | None = None
    temp_c_max: float | None = None
    clock_ratio_min: float | None = None
    clock_ratio_max: float | None = None
    groups: tuple[Group, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["groups"] = [asdict(g) for g in self.groups]
        return d


def level_of(inflight: int) -> tuple[int, int]:
    for lo, hi in LEVELS:
        if lo <= inflight <= hi:
            return lo, hi
    return LEVELS[-1]


def _sf(k: int, n: int, p: float) -> float:
    """P(X ≥ k), X ~ Binomial(n, p): exact for small n, the normal approximation (with
    continuity correction) beyond, where the exact sum overflows floats."""
    if n <= 400:
        return binom_sf(k, n, p)
    sd = math.sqrt(n * p * (1.0 - p))
    return 1.0 - normal_cdf((k - 0.5 - n * p) / sd)


def minute_share(per_minute: int, attainment: float = MINUTE_ATTAINMENT) -> float:
    """The largest share of chat answers over the target at which a minute of `per_minute`
    answers still has its p95 within the target in `attainment` of minutes.

    A minute's p95 (numpy's linear rule) lies between its answers of rank ⌊0.95·(n−1)⌋ and
    the next, so it can be over the target once the upper of the two is: k = n − 1 − that
    rank answers over it (n − that rank where the p95 falls on the answer itself; a slow
    enough k-th pulls the interpolation over, so this is a bound). The share p solves
    P(Binomial(n, p) ≥ k) = 1 − attainment. With ~24 answers a minute it is 0.6 %, far under
    the 5 % a pooled p95 allows: a minute of few answers misses on its second-slowest.
    """
    if per_minute < 1:
        raise ValueError(f"chat answers a minute must be at least 1, got {per_minute}")
    if not 0.0 < attainment < 1.0:
        raise ValueError(f"attainment must be in (0, 1), got {attainment}")
    pos = 0.95 * (per_minute - 1)
    # Where the rank falls on an answer (pos whole), the one after it does not count.
    k = per_minute - math.floor(pos) - (1 if pos > math.floor(pos) else 0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if _sf(k, per_minute, mid) <= 1.0 - attainment:
            lo = mid
        else:
            hi = mid
    return lo


AUTO = "auto"  # `control.chat_per_minute`: the gateway's own count of chat, where it has one


def judged_per_minute(setting: int | str, seen: int | None) -> int:
    """The chat answers a minute a map is judged by (0: the pooled p95): the setting where it
    is a count; for "auto", `seen` (the gateway's count over the span), else 0 where the
    gateway counted none."""
    if setting == AUTO:
        return seen or 0
    return int(setting)


def share_for(per_minute: int) -> float:
    """The share a group may hold over the target: `minute_share(per_minute)`, or the pooled
    p95's EXCEED_SHARE for 0 (`control.chat_per_minute`'s default)."""
    return EXCEED_SHARE if per_minute == 0 else minute_share(per_minute)


def rule_words(per_minute: int) -> str:
    """What "chat holds" means for a map judged with `per_minute` (0: the pooled p95)."""
    if per_minute == 0:
        return "chat's p95 within the target, pooled over the probes"
    return (
        f"chat's p95 within the target in {MINUTE_ATTAINMENT * 100:.0f} % of one-minute windows of "
        f"{per_minute} answers"
    )


def _verdict(n: int, over: int, share: float = EXCEED_SHARE) -> tuple[str, bool]:
    """holds / fails / unsure, and whether the data rule out the other reading.

    A group holds with at most `share` of its observations over the target. Holds is sure
    when an exceedance of twice the allowed share would show this few overs with probability
    under SURE_RISK; fails is sure when the allowed share would show this many with
    probability under SURE_RISK.
    """
    if n < MIN_GROUP:
        return "unsure", False
    if over <= share * n:
        p_as_few = 1.0 - _sf(over + 1, n, min(1.0, 2 * share))
        return "holds", p_as_few < SURE_RISK
    return "fails", _sf(over, n, share) < SURE_RISK


def groups_of(
    obs: Sequence[Observation], target_ms: float, share: float = EXCEED_SHARE
) -> tuple[Group, ...]:
    by: dict[tuple[int, int], list[float]] = {}
    for o in obs:
        by.setdefault(level_of(o.batch_inflight), []).append(o.ttft_ms)
    out = []
    for (lo, hi), values in sorted(by.items()):
        over = sum(1 for v in values if v > target_ms)
        verdict, sure = _verdict(len(values), over, share)
        out.append(Group(lo, hi, len(values), over, quantile(values, 0.95), verdict, sure))
    return tuple(out)


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}–{hi}"


def decide_row(
    state: str,
    groups: Sequence[Group],
    unit: str = "probes",
    load: str = "with {} batch in flight",
    share: float = EXCEED_SHARE,
) -> StateRow:
    """A state's answer from its groups (ascending): the top of the highest group that holds
    below the first that fails. `load` words a group's load for the settle hint."""
    n = sum(g.n for g in groups)
    told = [g for g in groups if g.verdict != "unsure"]
    first_fail = next((g for g in told if g.verdict == "fails"), None)
    passing = [
        g for g in told if g.verdict == "holds" and (first_fail is None or g.hi < first_fail.lo)
    ]

    def row(allowance: int | None, bound: str, confidence: str, settle: str) -> StateRow:
        return StateRow(state, n, allowance, bound, confidence, settle, unit)

    if not told:
        most = max(groups, key=lambda g: g.n, default=None)
        if most is None:
            return row(None, "none", "not enough data", f"{MIN_GROUP} {unit} while {state}")
        where = load.format(_span(most.lo, most.hi))
        return row(
            None,
            "none",
            "not enough data",
            f"{MIN_GROUP - most.n} more {unit} {where} while {state}",
        )
    if not passing:
        assert first_fail is not None
        if first_fail.lo == 0:
            settle = "" if first_fail.sure else f"more {unit} {load.format(0)} while {state}"
            return row(0, "exact", "sure" if first_fail.sure else "likely", settle)
        cap = first_fail.lo - 1
        return row(cap, "at most", "likely", f"{unit} {load.format(_span(0, cap))} while {state}")
    best = passing[-1]
    if first_fail is None:
        top = best.hi if best.hi < LEVELS[-1][1] else best.lo
        # Above it, too few to judge: one that leans to failing is what would settle it,
        # and "none above was seen failing" would not be true.
        leaning = next((g for g in groups if g.lo > best.hi and g.over > share * g.n), None)
        if leaning is not None:
            where = load.format(_span(leaning.lo, leaning.hi))
            return row(
                top, "at least", "likely",
                f"more {unit} {where} while {state}: {leaning.over} of {leaning.n} there were "
                "over the target, too few to judge",
            )  # fmt: skip
        return row(
            top, "at least", "likely",
            f"{unit} {load.format(f'over {best.hi}')} while {state} (none above was seen failing)",
        )  # fmt: skip
    sure = best.sure and first_fail.sure
    settle = ""
    if not sure:
        weak = best if not best.sure else first_fail
        settle = f"more {unit} {load.format(_span(weak.lo, weak.hi))} while {state}"
    elif first_fail.lo - best.hi > 1:
        gap = _span(best.hi + 1, first_fail.lo - 1)
        settle = f"{unit} {load.format(gap)} while {state}"
    return row(best.hi, "exact", "sure" if sure else "likely", settle)


def headroom_map(
    obs: Iterable[Observation],
    target_ms: float,
    unit: str = "probes",
    share: float = EXCEED_SHARE,
) -> list[StateRow]:
    """One row per state seen, coolest first; a group holds with at most `share` of its
    observations over the target (5 %: its p95 within it; `minute_share` for the SLO's
    one-minute windows)."""
    by: dict[str, list[Observation]] = {}
    for o in obs:
        by.setdefault(o.state, []).append(o)
    rows = []
    for state in STATES:
        if state not in by:
            continue
        group = by[state]
        groups = groups_of(group, target_ms, share)
        row = decide_row(state, groups, unit, share=share)
        temps = [o.temp_c for o in group if o.temp_c is not None]
        ratios = [o.clock_ratio for o in group if o.clock_ratio is not None]
        rows.append(
            replace(
                row,
                groups=groups,
                temp_c_min=min(temps) if temps else None,
                temp_c_max=max(temps) if temps else None,
                clock_ratio_min=round(min(ratios), 3) if ratios else None,
                clock_ratio_max=round(max(ratios), 3) if ratios else None,
            )
        )
    return rows


def row_for(rows: Sequence[StateRow], state: str) -> StateRow | None:
    return next((r for r in rows if r.state == state), None)


# What puts a probe in each state, for a person reading the map: the bands a row prints are
# of the probes it holds, and overlap (a cool-running card held under 0.97 of its clock by
# load or the power cap is warm at 46 °C).
STATE_RULE = (
    f"hot: a thermal throttle bit, or the clock under {HOT_CLOCK_RATIO:.2f} of its maximum; "
    f"warm: the clock under {WARM_CLOCK_RATIO:.2f}, or within {WARM_MARGIN_C:.0f} °C of where "
    "the clocks start to fall for heat; cool: neither (the clock of an idle card, at its "
    "floor whatever the heat, is not read)"
)


def describe(row: StateRow) -> str:
    """One line: `hot   4 (sure, 312 probes, 71–84 °C, clock 0.80–0.89)`."""
    if row.allowance is None:
        answer = "not enough data yet"
    else:
        answer = {"exact": "", "at least": "≥ ", "at most": "≤ ", "none": ""}[row.bound] + str(
            row.allowance
        )
    bands = []
    if row.temp_c_min is not None and row.temp_c_max is not None:
        bands.append(f"{row.temp_c_min:.0f}–{row.temp_c_max:.0f} °C")
    if row.clock_ratio_min is not None and row.clock_ratio_max is not None:
        bands.append(f"clock {row.clock_ratio_min:.2f}–{row.clock_ratio_max:.2f}")
    extra = f", {', '.join(bands)}" if bands else ""
    text = f"{row.state:<7} {answer}  ({row.confidence}, {row.n} {row.unit}{extra})"
    if row.settle:
        text += f"; would settle it: {row.settle}"
    return text


def onset_c(row: dict[str, Any]) -> float | None:
    """Where the clocks of the GPU behind a stored sample start to fall for heat: the lower
    of its target temperature and SLOWDOWN (GPU_MAX and a learned threshold are not kept per
    sample; nvml/thresholds.py has the whole rule)."""
    onset = throttle_onset(
        target_c=row.get("temp_target_c"), gpu_max_c=None, slowdown_c=row.get("temp_slowdown_c")
    )
    return onset.temp_c if onset else None


def observation_from(row: dict[str, Any]) -> Observation:
    """An Observation from a probe row joined with its GPU sample
    (`llm_watchdog.store.headroom.probe_states`)."""
    clock, top = row.get("sm_clock_mhz"), row.get("sm_clock_max_mhz")
    return Observation(
        ttft_ms=float(row["ttft_ms"]),
        batch_inflight=int(row["batch_inflight"]),
        state=thermal_state(
            sm_clock_mhz=clock,
            sm_clock_max_mhz=top,
            temp_c=row.get("temp_c"),
            temp_slowdown_c=onset_c(row),
            reasons=row.get("throttle_reasons"),
        ),
        temp_c=row.get("temp_c"),
        # The band a row shows: an idle card's clock is not read, as its state does not.
        clock_ratio=clock_ratio(clock, top, row.get("throttle_reasons")),
        chat_per_s=None if row.get("chat_per_s") is None else float(row["chat_per_s"]),
    )
