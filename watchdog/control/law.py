"""The allowance law: recent chat latency and the GPU's state in, the next batch allowance out.

Pure and time-injected: `AllowanceController.step(ControlInput)` takes the samples since the
last step and `now_s`, and returns a `ControlAction` saying what to set and why. No clock,
socket or database here, so the daemon, `replay` and the heat lab's virtual time run the same
code. It steps once a second (the daemon's `control.interval`, the lab's INTERVAL_S): a chat
burst turns into a queue within seconds. Latencies in ms, times in s; T is `target_p95_ms`,
L the allowance.

The core is the starting-point law, after Breakwater (Cho et al., OSDI '20), Netflix
concurrency-limits and Envoy's adaptive concurrency filter:

- Signal: ln TTFT of chat (canaries and the gateway's real chat TTFTs); an EWMA of its mean
  and variance (weight `ewma_alpha`) gives p̂95 = exp(μ̂ + 1.645 σ̂). A failed canary is a
  violation: it enters as a sample at `halve_ratio`·T and halves like one.
- Cut when p̂95 > `cut_ratio`·T, to L·max(`max_cut_factor`, `cut_ratio`·T / p̂95); halve on
  one sample over `halve_ratio`·T; at most one cut per `drain_time_s` (a cut does not stop
  running batch requests; its effect shows once they have finished).
- Grow by max(1, ⌈`grow_fraction`·L⌉) once p̂95 < `grow_ratio`·T for `grow_after_samples`
  samples in a row and `grow_cooldown_s` has passed since the last change; hold in between
  (the dead band). At one step a second noise has many chances to cross a line, so the
  EWMA weight is small and the growth line sits well under the cut line: the steady state
  is then not a cut-and-grow cycle at the line.

On top of that core, each a `ControlConfig` field (`design_law()` turns them all off and
puts back the starting point's EWMA weight 0.1 and growth line 0.8 T):

- `freeze="falling"`: heat means "don't probe upward *while it gets worse*". The ceiling is
  frozen while the SM clock is still falling under a thermal reason and released once it
  has held for `freeze_release_s`; a card settled at a lower clock is a slower card, which
  the latency feedback handles. A power cap alone never freezes: the clock it sets moves
  with our own load. ("throttled" freezes under any thermal or power reason until the
  clocks are normal, which a card at its power cap or temperature target may never be.)
- `window_s`: the SLO is judged per minute, so a few slow answers are a violation whatever
  an EWMA says. The signal is the larger of the EWMA's p̂95 and the empirical p95 of the
  samples of the last `window_s` seconds since the last cut.
- `surge_ratio`: knowing the cause when it is load. Chat comes in bursts, and the cliff
  (chat queueing behind batch prefills in the engine) comes seconds after a burst starts,
  faster than running batch requests drain. A surge in chat arrivals (`SurgeDetector`)
  sheds batch in proportion at once, and how the surge went (its chat p95 over its first
  `window_s`, the minute the SLO loses or keeps) teaches a ceiling: a surge missed from
  level L caps growth at `surge_backoff`·L; one as large, met from the cap with room to
  spare, raises the cap by one growth step, max(1, ⌈`grow_fraction`·cap⌉); a cap learned
  under a thermal slowdown bit holds only while a bit is set (`surge_cap_hot_only`); a cap
  goes once the card has been cooler than when it was learned, or no surge has come, for
  `surge_cap_retest_s` (`surge_cap_quiet_retest`), and the next surge judges anew. Raised by
  met surges, a cap stops at `surge_creep_limit` of the lowest level one was missed from.
  `surge_memory`/`seed_surge` carry a cap across a restart of the daemon, its quiet time
  counted from the new run's first step. Surges are counted from chat *arrivals* when the
  serving layer reports them (`ControlInput.chat_arrivals`): first tokens come late and few
  once a burst has queued behind itself.
- `app_limited_headroom`: never grow more than this above what the batch job has in flight
  (Gradient2's "don't grow the limit if we are app limited"), or `app_limited_fraction` of
  it where that is more: an allowance nobody uses buys nothing, and lets a sudden batch
  burst swamp chat at once. It also paces growth: every request admitted starts with a long
  prefill, and many admitted at once prefill together and stall chat for seconds.
- `cut_from_running`: a cut (proportional or halving) is taken from what runs,
  min(allowance, batch in flight): an allowance above the batch requests in flight is room
  nobody uses, and a cut of that room alone changes nothing for chat.
- `grow_fast_below`: far below the target (p̂95 < this × T) growth is multiplicative
  (`grow_fast_fraction`), so an allowance cut by a passing burst comes back in a few steps.
- `engine_slots`, `slot_reserve`, `slot_margin`: the cliff is often the engine's slots, not
  its speed. An engine runs at most max_num_seqs (llama.cpp: --parallel) sequences; a chat
  request that finds them all taken waits for one to finish, and batch requests hold theirs
  for their whole life. So growth stops at slots − `slot_reserve` × the usual chat in
  flight (room for a burst), and when batch + chat in flight pass slots − `slot_margin` (at
  most an eighth of the slots), batch is cut to what is left at once, with no drain time to
  wait for: it is a count, not an estimate. Both need the slot count and the chat in flight
  (`ControlInput.chat_inflight`); without either they are off. Where the serving layer
  holds that line itself (`serving_slots`: the gateway's slot line, read back from GET
  /control), it lets batch in only under it, request by request, and the law makes no slot
  cut: each one was a write to take back when the chat burst passed.
- A cut for load (a surge shed, a slot cut) leaves a frozen ceiling where heat put it: it
  says nothing about the card.
- `cut_memory_s`: a latency cut under a thermal slowdown bit remembers the batch that ran
  when chat slowed, and growth stops one under it while the bit holds, the card is in no
  cooler thermal state, and `cut_memory_s` has not passed: regrowing to it on the same hot
  card brings the same slowdown back (TCP's ssthresh).
- `clock_fall_cut`: under a thermal slowdown bit, a busy clock under half its busiest of the
  last minute cuts what runs by the same share at once, before the latency signal shows it.
- `map_fail_cap`: growth stops under a batch level group the headroom map is sure fails in
  the current thermal state, judged as the SLO's one-minute windows of the usual chat count
  where the serving layer counts chat. The p95 estimate sits in the dead band where a
  minute of ~24 answers still misses one time in ten, and the law probes into it on noise
  alone; this run's own answers say where not to go. With `map_fail_cap_seed`, the earlier
  days' answers (`seed_map`) count too for the run's first `headroom_memory_s`, then the
  level is tried anew.
- What a surge that was met had shed comes back at the fast pace (a quarter of the level per
  step): arrivals are Poisson, false alarms happen a few times an hour, and each should cost
  a few changes. Where the serving layer ramps a raise (`serving_ramps`: the gateway's
  batch ramp, read back from GET /control), a surge met with room to spare (p95 under
  `grow_ratio`·T) comes back in one write once chat arrives and runs as usual again, and
  the gateway lets the requests in one at a time. A surge missed with no batch running
  (the allowance already at the floor) teaches no surge cap: chat alone was too much.

docs/control.md tells why each rule exists and how the values were chosen, with the heat
lab's figures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from llm_watchdog.control.headroom import (
    STATES,
    WARM_MARGIN_C,
    Observation,
    StateRow,
    describe,
    groups_of,
    headroom_map,
    level_of,
    share_for,
    thermal_state,
)
from llm_watchdog.control.signals import LogEwma, SurgeDetector
from llm_watchdog.control.slots import SLOTS_KEPT_FOR_CHAT, slots_kept
from llm_watchdog.nvml.throttle import GPU_IDLE, POWER_MASK, THERMAL_MASK, reason_names
from llm_watchdog.stats import quantile

KINDS = ("cut", "halve", "grow", "hold", "freeze")
# Earlier days' chat kept per (thermal state, batch level) for the headroom map: enough for a
# sure verdict at 5 % over the target, and a bound on memory whatever the history holds.
MAP_PRIOR_PER_CELL = 400
# The temperature's pace is read over this long: long enough that a prefill spike's degree
# is not a trend, short enough that a fan stopping shows within a minute.
HEAT_PACE_S = 60.0
# The busy clock a fall is measured from: the busiest of the last minute.
CLOCK_FALL_WINDOW_S = 60.0
# Chat's arrival rate a map sample is stamped with, and the map's answers are read at: over
# this long, as the SLO's minutes are judged, and twice that to steady a slow rate's count.
CHAT_RATE_WINDOW_S = 120.0
# The map's failing groups are read again this often: a verdict moves over minutes, and a
# read groups up to hours of chat.
FAIL_LEVELS_EVERY_S = 30.0
FREEZE_MODES = ("throttled", "falling", "off")


@dataclass(frozen=True)
class ControlConfig:
    """Settings of the law. Durations in seconds, latencies in milliseconds."""

    target_p95_ms: float  # T: the chat TTFT p95 the SLO promises
    floor: int = 0  # the allowance never goes below this
    ceiling: int = 64  # nor above this
    default_allowance: int = 8  # before the first step, and what a lease falls back to
    drain_time_s: float = 20.0  # one cut per this: the order of a batch request's life
    grow_cooldown_s: float = 15.0  # after any change, wait this long before growing
    grow_fraction: float = 0.05  # additive growth: max(1, ⌈fraction·L⌉)
    grow_after_samples: int = 3  # p̂95 < grow_ratio·T for this many samples in a row
    cut_ratio: float = 0.9  # cut when p̂95 > cut_ratio·T ...
    grow_ratio: float = 0.7  # ... grow when below grow_ratio·T; hold in between
    halve_ratio: float = 2.0  # one sample over halve_ratio·T halves the allowance
    max_cut_factor: float = 0.5  # a proportional cut keeps at least this share of L
    ewma_alpha: float = 0.05  # weight of one sample in the EWMA of ln TTFT
    min_samples: int = 5  # no decision before this many samples
    freeze: str = "falling"  # "throttled" (the starting point), "falling" or "off"; module doc
    freeze_release_s: float = 180.0
    min_clock_drop: float = 0.01  # a clock fall smaller than this share is noise (one bin)
    clock_normal_ratio: float = 0.0  # "throttled": a busy clock under this × max throttles
    lease_s: float = 120.0  # lease sent with every write; the serving layer falls back after
    window_s: float = 60.0  # 0: EWMA only
    window_min_samples: int = 10
    surge_ratio: float = 2.0  # 0: no surge detection
    surge_window_s: float = 10.0
    surge_slow_s: float = 600.0
    surge_z: float = 3.0
    surge_min_count: int = 6
    surge_warmup_s: float = 60.0
    surge_confirm: int = 3  # steps in a row that must see the surge
    surge_backoff: float = 0.5
    app_limited_headroom: int = 2  # 0: off
    # ... or this share of what is in flight, if more: +2 is a growth step on a small engine
    # and 2 % of one that runs 96, where a job filling its allowance climbs in 46 writes.
    app_limited_fraction: float = 0.1
    # The map learns from chat at its usual rate: answers from a surge, and from the window
    # after it while its queue drains, tell of the load, not of the card's thermal state.
    map_skip_surges: bool = True
    grow_fast_below: float = 0.5  # 0: off
    grow_fast_fraction: float = 0.25
    cut_from_running: bool = True  # cut min(allowance, in flight), not the allowance
    # The serving layer ramps a raise itself (the gateway's batch ramp): what a met surge
    # shed comes back in one write, and the gateway lets it in a request at a time.
    serving_ramps: bool = False
    # The serving layer holds batch under the engine's slots itself (the gateway's slot
    # line): no slot cut is written, the gateway lets batch in as chat frees slots.
    serving_slots: bool = False
    engine_slots: int = 0  # sequences the engine runs at once (max_num_seqs); 0: not known
    slot_reserve: float = 3.0  # grow no further than slots − this × usual chat in flight
    # Cut when batch + chat > slots − this (≤ slots/8, ≥ 1; the gateway's line); -1: off.
    slot_margin: int = SLOTS_KEPT_FOR_CHAT
    # Grow no further than slots − margin − chat's recent peak: this quantile of chat in
    # flight over slot_peak_s (0: off; docs/control.md says what it costs in batch).
    slot_peak_s: float = 0.0
    slot_peak_quantile: float = 0.99
    grow_to_demand: bool = True  # never grow past batch in flight + queued (where known)
    max_grows_per_h: float = 0.0  # grows in any hour; cuts are never held back; 0: off
    surge_heat_factor: float = 1.5  # under a thermal slowdown a surge sheds at this × ratio
    # A surge sheds only once one of its answers (or the estimate) is over this × T: chat
    # that a surge leaves fast needs no room made for it (0: every surge sheds). With
    # `surge_gate_minutes`, only surges that are none over the median of the last that many
    # one-minute rates wait: chat that stepped up, read against an EWMA still catching up.
    # Off: as many runs met, a few fewer windows missed and less churn where chat steps up,
    # but windows lost on a card with rare big bursts (docs/control.md, "Surges").
    surge_shed_gate: float = 0.0
    surge_gate_minutes: int = 0
    # The usual arrival rate is at least the median of the last this many one-minute rates
    # (0: the EWMA alone): chat that steps up and stays is the usual within minutes. Off:
    # fewer changes and more batch where chat steps up, but more missed windows at unseen
    # seeds (docs/control.md, "Surges").
    surge_level_minutes: int = 0
    surge_cap_retest_s: float = 1200.0  # a surge cap whose conditions are gone this long goes
    # A surge cap learned under a thermal slowdown bit holds growth only while a bit is set: a
    # surge missed on a card at a third of its clock says nothing of the card once it is cool.
    surge_cap_hot_only: bool = True
    # A surge cap also goes once no surge has come for `surge_cap_retest_s`: the load it was
    # learned in is gone too, and a cap met by no surge holds growth on a quiet card for hours.
    surge_cap_quiet_retest: bool = True
    # A cap raised by met surges stops this far under the lowest level a surge was missed
    # from while it lasts (0: off): past it, the next raise would find that miss again.
    surge_creep_limit: float = 0.9
    headroom: bool = True  # act on the headroom map learned from chat (control/headroom.py)
    headroom_dwell_s: float = 10.0  # a thermal state counts once it has held this long
    headroom_memory_s: float = 4 * 3600.0  # samples the map is learned from
    # A move into a cooler state grows back to its row only this far below the slowdown
    # temperature: a card resting just under it has cooled because the cut unloaded it.
    headroom_cool_margin_c: float = 5.0
    # The card heads for where its clocks fall (rising, and at this pace there within this
    # long): no growing into it, and a cut to the map's hot row where the map knows it.
    heat_eta_s: float = 120.0  # 0: off
    # The cut ahead of the heat goes to the hot row learned at clocks of at least this share
    # of the maximum (0: the whole hot row). A card that creeps into its slowdown arrives at
    # its top clocks; the answers of a card at half its clock (a cooler that failed) would
    # cut it to a level it never needs (docs/control.md, "Before the heat arrives").
    map_ahead_clock: float = 0.8
    # A latency cut remembers what failed: growth stops one under the batch that ran when
    # chat slowed, for this long, or until the card is in a cooler thermal state (0: off).
    cut_memory_s: float = 1200.0
    # ... only for a cut under a thermal slowdown bit, and only while a bit is set: on a cool
    # card a cut is as often a passing chat peak, and holding under it cost 5 % of batch
    # on workstation and ambient-step (docs/control.md).
    cut_memory_hot_only: bool = True
    # Under a thermal slowdown bit, a busy SM clock under this share of its busiest of the last
    # minute cuts what runs by the same share at once (0: off). The engine runs at the clock's
    # pace; the latency estimate shows a fall that deep only once a minute is lost
    # (hr-fans-stall-twice: 0.94 → 0.31 of the maximum in 40 s). A prefill's dip is shallower.
    clock_fall_cut: float = 0.5
    # No growth into a batch level group the headroom map is sure fails in the current thermal
    # state, judged as the SLO judges: minutes of the usual chat count (`minute_share`) where
    # the serving layer counts chat, the pooled p95 where it does not. A law that probes
    # above the edge on noise alone (office-tight-target: 16 → 20 → cut, ~100 changes an
    # hour) stops where this run's answers have shown chat fail, and tries again once they
    # age out of the map (`headroom_memory_s`).
    map_fail_cap: bool = True
    # The cap also weighs the earlier days' answers (`seed_map`) for the run's first
    # `headroom_memory_s`, as this run's own would be weighed before they age out: the level
    # the card failed at yesterday is not probed again on the first morning. After that the
    # level is tried anew, and this run's answers alone judge it.
    map_fail_cap_seed: bool = True
    # A sure failure needs at least this many answers over the target in its group. At ~10
    # answers a minute a group may hold 0.1 % over, and one slow answer in ~90 passes the
    # binomial bar on its own (laptop-dock-bursts: held at 1 for a run by one answer at 2).
    # 1: that one answer caps; 2 is measured in docs/control.md.
    map_fail_min_over: int = 1
    # The fail cap leaves out answers of chat that arrived at more than this factor of its
    # rate now (0: every rate counts). Headroom falls as chat's rate rises, so a level that
    # failed under a lunch hour's rush need not fail the calmer afternoon (hr-smallcase-lunch:
    # held at 0 for an hour after lunch by answers from lunch). Off: on the benchmark it gave
    # back more windows than it saved (docs/control.md, "Chat's rate and the fail cap").
    map_rate_band: float = 0.0

    @property
    def slot_line(self) -> int:
        """The engine's slots less the margin: batch and chat in flight fit under it."""
        # The gateway's rule (control.slots): an eighth of the slots, 1 to `slot_margin`.
        return self.engine_slots - slots_kept(self.engine_slots, self.slot_margin)

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"control: {what}")

        need(self.target_p95_ms > 0, f"target_p95_ms must be > 0 ms, got {self.target_p95_ms}")
        need(
            0 <= self.floor <= self.ceiling,
            f"need 0 ≤ floor ≤ ceiling, got floor {self.floor}, ceiling {self.ceiling}",
        )
        need(
            self.floor <= self.default_allowance <= self.ceiling,
            f"default_allowance must be within [{self.floor}, {self.ceiling}], "
            f"got {self.default_allowance}",
        )
        need(
            0 < self.grow_ratio <= self.cut_ratio < self.halve_ratio,
            "need 0 < grow_ratio ≤ cut_ratio < halve_ratio",
        )
        need(0 < self.ewma_alpha <= 1, f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        need(0 < self.max_cut_factor < 1, "max_cut_factor must be in (0, 1)")
        need(0 < self.surge_backoff < 1, "surge_backoff must be in (0, 1)")
        need(0 <= self.surge_creep_limit < 1, "surge_creep_limit must be in [0, 1)")
        need(
            self.map_rate_band == 0 or self.map_rate_band > 1,
            f"map_rate_band must be 0 (off) or > 1, got {self.map_rate_band}",
        )
        need(
            self.freeze in FREEZE_MODES,
            f"freeze must be one of {', '.join(FREEZE_MODES)}, got {self.freeze!r}",
        )
        need(self.lease_s > 0, f"lease_s must be > 0 s, got {self.lease_s}")
        need(
            self.engine_slots >= 0,
            f"engine_slots must be ≥ 0 (0: not known), got {self.engine_slots}",
        )
        need(self.slot_reserve >= 0, f"slot_reserve must be ≥ 0, got {self.slot_reserve}")
        need(self.slot_margin >= -1, f"slot_margin must be ≥ 0 (-1: off), got {self.slot_margin}")
        need(self.slot_peak_s >= 0, f"slot_peak_s must be ≥ 0 s (0: off), got {self.slot_peak_s}")
        need(
            0 < self.slot_peak_quantile <= 1,
            f"slot_peak_quantile must be in (0, 1], got {self.slot_peak_quantile}",
        )
        need(self.max_grows_per_h >= 0, f"max_grows_per_h must be ≥ 0, got {self.max_grows_per_h}")
        need(self.surge_heat_factor >= 1, "surge_heat_factor must be ≥ 1")
        need(
            0 <= self.map_ahead_clock < 1,
            f"map_ahead_clock must be in [0, 1) (0: off), got {self.map_ahead_clock}",
        )
        need(0 <= self.surge_shed_gate < 1, "surge_shed_gate must be in [0, 1) (0: off)")
        need(self.surge_gate_minutes >= 0, "surge_gate_minutes must be ≥ 0 (0: every surge)")
        for name in (
            "drain_time_s",
            "grow_cooldown_s",
            "freeze_release_s",
            "window_s",
            "surge_cap_retest_s",
            "headroom_dwell_s",
            "headroom_memory_s",
            "headroom_cool_margin_c",
            "heat_eta_s",
            "cut_memory_s",
        ):
            value = getattr(self, name)
            need(value >= 0, f"{name} must be ≥ 0 s, got {value}")
        need(
            0 <= self.clock_fall_cut < 1,
            f"clock_fall_cut must be in [0, 1) (0: off), got {self.clock_fall_cut}",
        )
        need(
            self.map_fail_min_over >= 1,
            f"map_fail_min_over must be ≥ 1, got {self.map_fail_min_over}",
        )


def design_law(config: ControlConfig) -> ControlConfig:
    """The same settings with every addition turned off: the starting-point law.

    docs/control.md, "The starting point", describes that law.
    """
    return replace(
        config,
        freeze="throttled",
        window_s=0.0,
        surge_ratio=0.0,
        app_limited_headroom=0,
        grow_fast_below=0.0,
        cut_from_running=False,
        grow_ratio=0.8,
        ewma_alpha=0.1,
        slot_reserve=0.0,
        slot_margin=-1,
        slot_peak_s=0.0,
        serving_ramps=False,
        serving_slots=False,
        grow_to_demand=False,
        max_grows_per_h=0.0,
        surge_heat_factor=1.0,
        surge_level_minutes=0,
        surge_cap_retest_s=0.0,
        surge_cap_hot_only=False,
        surge_cap_quiet_retest=False,
        surge_creep_limit=0.0,
        headroom=False,
        heat_eta_s=0.0,
        cut_memory_s=0.0,
        clock_fall_cut=0.0,
        map_fail_cap=False,
        map_fail_cap_seed=False,
        map_rate_band=0.0,
        surge_shed_gate=0.0,
        surge_gate_minutes=0,
    )


@dataclass(frozen=True)
class GpuState:
    """What the law needs from NVML; None anywhere means "not known"."""

    throttle_reasons: int | None = None  # NVML clocks-event reasons bitmask
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    temp_c: float | None = None
    temp_slowdown_c: float | None = None

    @property
    def state(self) -> str:
        """The headroom map's thermal state (cool, warm, hot) of this reading."""
        return thermal_state(
            sm_clock_mhz=self.sm_clock_mhz,
            sm_clock_max_mhz=self.sm_clock_max_mhz,
            temp_c=self.temp_c,
            temp_slowdown_c=self.temp_slowdown_c,
            reasons=self.throttle_reasons,
        )

    @property
    def clock_ratio(self) -> float | None:
        if not self.sm_clock_mhz or not self.sm_clock_max_mhz:
            return None
        return self.sm_clock_mhz / self.sm_clock_max_mhz

    @property
    def busy_clock_ratio(self) -> float | None:
        """The clock ratio of a working card; None while idle: an idle card shows its idle
        clock, which is neither a fall nor a reading to compare with."""
        return None if self.has(GPU_IDLE) else self.clock_ratio

    def has(self, mask: int) -> bool:
        return bool(self.throttle_reasons and self.throttle_reasons & mask)


@dataclass(frozen=True)
class ControlInput:
    """What happened since the last step."""

    now_s: float  # seconds on any steady clock (monotonic in the daemon, virtual in the lab)
    chat_ttfts_ms: tuple[float, ...] = ()  # canary and real chat TTFTs since the last step
    failed_canaries: int = 0  # canaries that got no first token: counted as violations
    gpu: GpuState | None = None  # None: no NVML, the law runs on latency alone
    batch_inflight: int | None = None  # batch requests running at the serving layer
    allowance: int | None = None  # the allowance in force, as read back (None: not known)
    # What the serving layer sees of chat before any answer (None: not known). Arrivals show
    # a burst as it comes, not seconds later when its first tokens land (behind the queue
    # the burst itself builds); chat in flight holds engine slots batch cannot take.
    chat_arrivals: int | None = None  # chat requests that arrived since the last step
    chat_inflight: int | None = None  # chat requests at the serving layer, not yet finished
    batch_queued: int | None = None  # batch requests waiting at the serving layer for room


@dataclass(frozen=True)
class ControlAction:
    """One decision. `allowance_after` is what to write (equal to before on hold/freeze)."""

    ts: float  # the input's now_s
    allowance_before: int
    allowance_after: int
    reason: str  # one line
    inputs: dict[str, Any] = field(default_factory=dict)
    p95_est_ms: float | None = None
    kind: str = "hold"  # one of KINDS

    @property
    def changed(self) -> bool:
        return self.allowance_after != self.allowance_before


def is_throttled(gpu: GpuState | None, config: ControlConfig) -> bool:
    """A thermal or power reason holds the clocks, or a busy clock is under the normal ratio."""
    if gpu is None:
        return False
    if gpu.has(THERMAL_MASK | POWER_MASK):
        return True
    ratio = gpu.busy_clock_ratio
    return ratio is not None and ratio < config.clock_normal_ratio


class AllowanceController:
    """The law with its memory. One instance per controlled class; `step` once per interval."""

    def __init__(self, config: ControlConfig) -> None:
        c = config
        self.config = c
        self.allowance = c.default_allowance
        self.ewma = LogEwma(c.ewma_alpha)
        # The groups the map is sure fail in a state: ((state, seed counted), when read, bounds).
        self.fail_levels: tuple[tuple[str, bool], float, tuple[tuple[int, int], ...]] | None = None
        self.window: deque[tuple[float, float]] = deque()  # (now_s, ttft_ms) since last cut
        self.good_streak = 0  # samples in a row with p̂95 < grow_ratio·T
        self.samples_seen = 0
        self.last_now_s: float | None = None
        self.last_cut_s = -math.inf
        self.last_change_s = -math.inf
        self.frozen_ceiling: int | None = None
        self.settled_since_s: float | None = None
        self.last_clock_ratio: float | None = None
        self.surge = SurgeDetector(
            ratio=c.surge_ratio or math.inf,
            window_s=c.surge_window_s,
            slow_s=c.surge_slow_s,
            z=c.surge_z,
            min_count=c.surge_min_count,
            warmup_s=c.surge_warmup_s,
            confirm=c.surge_confirm,
            level_minutes=c.surge_level_minutes,
            keep_minutes=c.surge_gate_minutes,
        )
        self.surge_base: int | None = None  # the level when the current surge was confirmed
        self.surge_onset = 0  # the highest level in the lookback before it was confirmed
        self.recent_levels: deque[tuple[float, int]] = deque()
        self.surge_samples: list[tuple[float, float]] = []  # (now_s, TTFT ms)
        self.recent_samples: deque[tuple[float, float]] = deque()  # before this step
        self.surge_peak = 0.0  # the largest ratio of the current surge
        self.surge_cap: int | None = None  # learned: the highest level surges were met from
        self.surge_cap_ratio = 0.0  # the size of the largest surge missed
        self.surge_missed_at: int | None = None  # the lowest level a surge was missed from
        # A surge cap an earlier run learned (seed_surge) counts its quiet time from this
        # run's first step, as if a surge had just come: None until then, or none seeded.
        self.surge_seeded = False
        self.surge_seed_at: float | None = None
        self.regrow_to: int | None = None  # the level a met surge was shed from
        self.regrow_at_once = False  # ... in one write (`serving_ramps`)
        self.chat_usual: float | None = None  # chat in flight outside surges, an EWMA
        self.chat_usual_s = 0.0  # ... learned over this long
        self.chat_seen: deque[tuple[float, int]] = deque()  # (now_s, chat in flight)
        self.grow_times: deque[float] = deque()  # when each grow of the last hour was
        # The hot row a cut ahead of the heat went to: growth holds there while the card rests
        # by its slowdown temperature, or a card that hovers a degree either side of it would
        # be cut at every touch and grown back at every dip.
        self.ahead_level: int | None = None
        self.last_surge_s = -math.inf
        # The card when the surge cap was learned (thermal bit, clock ratio), and since when
        # it has been cooler than that: the cap is re-tested once that has lasted.
        self.surge_cap_heat: tuple[bool, float | None] | None = None
        self.surge_cap_gone_since: float | None = None
        # The headroom map's answers of the last hours: (now_s, chat TTFT ms, batch in flight,
        # thermal state, clock ratio or None, chat's rate per second or None).
        self.map_samples: deque[tuple[float, float, int, str, float | None, float | None]] = deque()
        self.chat_counts: deque[tuple[float, int, float]] = deque()  # (now_s, arrivals, dt)
        self.chat_rate: float | None = None  # chat's arrivals a second lately (_chat_rate)
        self.map_state: str | None = None  # the thermal state that has held dwell_s
        self.map_candidate: tuple[str, float] | None = None  # (state, since)
        self.map_grow_to: int | None = None  # the cooler state's row, until reached
        self.map_grow_row: str | None = None  # ... and that row, as text
        self.map_used: str | None = None  # the row the last map decision used
        self.map_prior: list[Observation] = []  # earlier days' chat (seed_map)
        self.map_prior_at: float | None = None  # the first step after the seed
        self.temps: deque[tuple[float, float]] = deque()  # (now_s, °C) of the last minute
        self.clocks: deque[tuple[float, float]] = deque()  # (now_s, busy clock ratio)
        # The batch that ran when the last latency cut came, when, and in which thermal state.
        self.failed: tuple[int, float, str | None] | None = None

    def seed_map(self, observations: Iterable[Observation]) -> int:
        """Earlier days' chat for the headroom map, each measured under a known load and card
        state (the daemon's stored probes): the map then knows a state before the card is next
        in it, and acts ahead the first time, not only once this run has seen the state. Keeps
        the newest MAP_PRIOR_PER_CELL of each (state, batch level); replaces an earlier seed.
        Returns how many it kept."""
        cells: dict[tuple[str, tuple[int, int]], deque[Observation]] = {}
        for o in observations:
            key = (o.state, level_of(o.batch_inflight))
            cells.setdefault(key, deque(maxlen=MAP_PRIOR_PER_CELL)).append(o)
        self.map_prior = [o for cell in cells.values() for o in cell]
        self.map_prior_at = None
        self.fail_levels = None
        return len(self.map_prior)

    def surge_memory(self) -> dict[str, Any] | None:
        """What surges have taught this run, for the next run on the same engine to start
        from (`seed_surge`): the cap, the largest surge missed, the lowest level one was
        missed from, and the card when the cap was learned. None while no cap holds."""
        if self.surge_cap is None:
            return None
        heat = self.surge_cap_heat
        return {
            "cap": self.surge_cap,
            "ratio": round(self.surge_cap_ratio, 3),
            "missed_at": self.surge_missed_at,
            "hot": None if heat is None else heat[0],
            "clock_ratio": None if heat is None or heat[1] is None else round(heat[1], 4),
        }

    def seed_surge(self, memory: Mapping[str, Any]) -> bool:
        """Start from a surge cap an earlier run learned (`surge_memory`): a restart does not
        meet the next burst from a level the last one was missed from. The cap goes as one
        learned here does, its quiet time counted from this run's first step. False, and
        nothing changed, where `memory` is not one."""
        cap, ratio, missed = memory.get("cap"), memory.get("ratio"), memory.get("missed_at")
        hot, clock = memory.get("hot"), memory.get("clock_ratio")
        if not (
            _count(cap)
            and cap > self.config.floor
            and _real(ratio)
            and (missed is None or _count(missed))
            and (hot is None or isinstance(hot, bool))
            and (clock is None or _real(clock))
        ):
            return False
        self.surge_cap, self.surge_cap_ratio, self.surge_missed_at = cap, float(ratio), missed
        self.surge_cap_heat = (
            None if hot is None else (hot, None if clock is None else float(clock))
        )
        self.surge_cap_gone_since = None
        self.surge_seeded, self.surge_seed_at = True, None
        return True

    # -- what came in ----------------------------------------------------------------------

    def _observe(self, inp: ControlInput) -> tuple[float | None, float, bool, list[float]]:
        """Feed the samples; return (p̂95, worst sample, severe, samples)."""
        c = self.config
        t = c.target_p95_ms
        values = list(inp.chat_ttfts_ms) + [c.halve_ratio * t] * inp.failed_canaries
        for v in values:
            self.ewma.add(v)
            p = self.ewma.p95_ms()
            self.good_streak = self.good_streak + 1 if p is not None and p < c.grow_ratio * t else 0
        self.samples_seen += len(values)
        est = self.ewma.p95_ms()
        if c.window_s > 0:
            self.window.extend((inp.now_s, v) for v in values)
            while self.window and self.window[0][0] <= inp.now_s - c.window_s:
                self.window.popleft()
            if est is not None and len(self.window) >= c.window_min_samples:
                est = max(est, quantile([v for _, v in self.window], 0.95))
                if est >= c.grow_ratio * t:
                    self.good_streak = 0
        worst = max(values, default=0.0)
        severe = inp.failed_canaries > 0 or worst > c.halve_ratio * t
        return est, worst, severe, values

    def _clock(self, inp: ControlInput, level: int) -> tuple[bool, float]:
        """Track throttling and the frozen ceiling; return (throttled, clock fall share)."""
        c = self.config
        gpu = inp.gpu
        throttled = is_throttled(gpu, c)
        ratio = None if gpu is None else gpu.busy_clock_ratio
        drop = 0.0
        if ratio is not None and self.last_clock_ratio is not None:
            drop = max(0.0, 1.0 - ratio / self.last_clock_ratio)
        if ratio is not None:
            self.last_clock_ratio = ratio
        if c.freeze == "throttled":
            freezing = throttled
        else:
            heat = gpu is not None and gpu.has(THERMAL_MASK)
            freezing = c.freeze == "falling" and heat and drop >= c.min_clock_drop
        if freezing:
            self.frozen_ceiling = (
                level if self.frozen_ceiling is None else min(self.frozen_ceiling, level)
            )
            self.settled_since_s = None
        elif self.frozen_ceiling is not None:
            if self.settled_since_s is None:
                self.settled_since_s = inp.now_s
            if inp.now_s - self.settled_since_s >= c.freeze_release_s:
                self.frozen_ceiling = None
                self.settled_since_s = None
        return throttled, drop

    def _surge(self, inp: ControlInput, level: int, values: list[float], dt: float) -> float:
        """The surge ratio while chat surges, else 0; learns the surge cap when one ends."""
        c = self.config
        if c.surge_ratio <= 0:
            return 0.0
        # Arrivals show a burst as it comes; first tokens show it late, behind its own queue.
        arrivals = len(values) if inp.chat_arrivals is None else inp.chat_arrivals
        surging = self.surge.add(inp.now_s, arrivals, dt)
        self.recent_levels.append((inp.now_s, level))
        while self.recent_levels[0][0] < inp.now_s - 2 * c.surge_window_s:
            self.recent_levels.popleft()
        if surging and self.surge_base is None:
            self.surge_base, self.surge_peak = level, 0.0
            # A surge is confirmed steps after it began, and a latency cut often comes
            # first: what it was met or missed from is the level before those cuts, and how
            # chat fared counts from its first seconds. The cut level would teach a cap far
            # too low, and what comes after the confirmation alone would call a surge "met"
            # whose minute was lost before the shed.
            self.surge_onset = max(lv for _, lv in self.recent_levels)
            self.surge_samples = list(self.recent_samples)
        elif not surging and self.surge_base is not None:
            # Judged as the SLO is, per minute: the burst's first minute is where it is won
            # or lost, and the minutes after its shed would water that down, so a surge
            # whose first minute was lost would count as met and teach no cap.
            judged = self.surge_samples
            if c.window_s > 0 and judged:
                judged = [x for x in judged if x[0] < judged[0][0] + c.window_s]
            seen = quantile([v for _, v in judged], 0.95) if judged else 0.0
            # Missed with no batch running (the level was already at the floor), or with so
            # little that backing off from it reaches the floor: chat alone was too much, and
            # there is nothing to learn about batch from it. A cap at the floor would keep
            # batch off the card at every hour, not only in surges, on one missed minute.
            cap = max(c.floor, math.floor(self.surge_onset * c.surge_backoff))
            if seen > c.target_p95_ms and cap > c.floor:
                self.surge_cap = cap if self.surge_cap is None else min(self.surge_cap, cap)
                onset = self.surge_onset
                missed = self.surge_missed_at
                self.surge_missed_at = onset if missed is None else min(missed, onset)
                gpu = inp.gpu
                self.surge_cap_heat = (
                    None if gpu is None else (gpu.has(THERMAL_MASK), gpu.clock_ratio)
                )
                self.surge_cap_gone_since = None
                self.surge_cap_ratio = max(self.surge_cap_ratio, self.surge_peak)
            elif (
                self.surge_cap is not None
                and self.surge_onset >= self.surge_cap
                and seen < c.grow_ratio * c.target_p95_ms
                and self.surge_peak >= 0.8 * self.surge_cap_ratio
            ):
                # Met from the cap with room to spare, and as big as the one that was
                # missed (a small surge met says little about a big one): try one more.
                # One step of ordinary growth: one more on a small engine, 5 % on a large one,
                # where one at a time would take hours to win back a halved cap.
                raised = self.surge_cap + max(1, math.ceil(c.grow_fraction * self.surge_cap))
                missed = self.surge_missed_at
                if c.surge_creep_limit > 0 and missed is not None:
                    raised = min(
                        raised, max(self.surge_cap, math.floor(c.surge_creep_limit * missed))
                    )
                self.surge_cap = raised
            # A surge met: what it shed comes back at the fast pace, not one step at a time
            # (a false alarm then costs a few changes, not a dozen).
            self.regrow_to = self.surge_onset if seen <= c.target_p95_ms else None
            # Met with room to spare (a false alarm looks like this): all of it at once where
            # the serving layer ramps. Met narrowly: step by step, each step judged anew.
            self.regrow_at_once = c.serving_ramps and seen < c.grow_ratio * c.target_p95_ms
            self.surge_base = None
        self.recent_samples.extend((inp.now_s, v) for v in values)
        while self.recent_samples and self.recent_samples[0][0] < inp.now_s - 2 * c.surge_window_s:
            self.recent_samples.popleft()
        if self.surge_base is None:
            return 0.0
        self.surge_samples.extend((inp.now_s, v) for v in values)
        self.surge_peak = max(self.surge_peak, self.surge.last_ratio)
        return max(self.surge.last_ratio, 1.0)

    # -- the decision ----------------------------------------------------------------------

    def step(self, inp: ControlInput) -> ControlAction:
        c = self.config
        t = c.target_p95_ms
        before = self.allowance if inp.allowance is None else inp.allowance
        level = min(max(before, c.floor), c.ceiling)
        est, worst, severe, values = self._observe(inp)
        throttled, drop = self._clock(inp, level)
        dt = 0.0 if self.last_now_s is None else max(0.0, inp.now_s - self.last_now_s)
        self.last_now_s = inp.now_s
        if self.map_prior and self.map_prior_at is None:
            self.map_prior_at = inp.now_s
        if self.surge_seeded and self.surge_seed_at is None:
            self.surge_seed_at = inp.now_s
        self.chat_rate = self._chat_rate(inp, values, dt)
        surge = self._surge(inp, level, values, dt)
        heat_now = inp.gpu is not None and inp.gpu.has(THERMAL_MASK)
        fall = self._clock_fall(inp)
        if surge:
            if c.map_skip_surges and inp.now_s - self.last_surge_s >= c.window_s:
                # Newly seen: the answers of the seconds the detector took to see it are the
                # surge's too.
                while self.map_samples and self.map_samples[-1][0] >= inp.now_s - c.surge_window_s:
                    self.map_samples.pop()
            self.last_surge_s = inp.now_s
        self._retest_surge_cap(inp, heat_now)
        learn = not (c.map_skip_surges and inp.now_s - self.last_surge_s < c.window_s)
        moved = self._map_observe(inp, values if learn else [])
        map_cut: StateRow | None = None
        if moved is not None:
            map_cut = self._map_move(moved, level, inp.gpu)
        eta = self._heat_eta(inp)
        if self.ahead_level is not None and not self._resting_at_limit(inp.gpu):
            self.ahead_level = None
        if eta is not None and map_cut is None:
            ahead = self._map_row("hot", clock_min=c.map_ahead_clock)
            if ahead is not None and ahead.bound in ("exact", "at most"):
                map_cut = ahead
        if inp.chat_inflight is not None and not surge:
            # The usual chat concurrency, learned outside surges over the same time as the
            # usual arrival rate: what a burst multiplies.
            # Young, it is the time-weighted mean of all seen so far: started from the first
            # reading alone, the EWMA took its 10 minutes to find chat's level, and the slot
            # rules grew into slots chat then needed and cut back, a change every few seconds
            # (hr-fans-fail-replaced: 58 changes in its first 10 minutes).
            if self.chat_usual is None:
                self.chat_usual = float(inp.chat_inflight)
                self.chat_usual_s = 0.0
            else:
                w = max(1.0 - math.exp(-dt / c.surge_slow_s), dt / (self.chat_usual_s + dt or 1.0))
                self.chat_usual += w * (inp.chat_inflight - self.chat_usual)
                self.chat_usual_s += dt
            if c.slot_peak_s > 0:
                self.chat_seen.append((inp.now_s, inp.chat_inflight))
                while self.chat_seen[0][0] < inp.now_s - c.slot_peak_s:
                    self.chat_seen.popleft()
        can_cut = inp.now_s - self.last_cut_s >= c.drain_time_s and level > c.floor
        shed_to = (
            None
            if not surge or self.surge_base is None
            else max(c.floor, math.floor(self.surge_base / surge))
        )
        # A card in thermal slowdown serves chat slower, and a slower engine holds chat
        # longer: arrivals then need a clearer surge to be read as load rather than heat.
        heat_not_load = (
            shed_to is not None and heat_now and surge < c.surge_ratio * c.surge_heat_factor
        )
        if heat_not_load:
            shed_to = None
        if shed_to is not None and c.surge_shed_gate > 0 and est is not None:
            # A surge read against a usual rate still catching up with a step in chat is
            # often chance; it sheds once chat shows it needs room, not before.
            gate = c.surge_shed_gate * t
            median = self.surge.level(c.surge_gate_minutes) if c.surge_gate_minutes else None
            stepped = median is not None and not self.surge.surge_over(median)
            if (
                (not c.surge_gate_minutes or stepped)
                and est < gate
                and all(v < gate for _, v in self.surge_samples)
            ):
                shed_to = None
        # A cut acts on what runs: an allowance above the batch requests in flight is room
        # nobody uses, and cutting only that changes nothing for chat.
        running = (
            min(level, inp.batch_inflight)
            if c.cut_from_running and inp.batch_inflight is not None
            else level
        )
        slot_room = (
            max(c.floor, c.slot_line - inp.chat_inflight)
            if c.engine_slots
            and c.slot_margin >= 0
            and inp.chat_inflight is not None
            and not c.serving_slots
            else None
        )
        kind, after, load_cut, latency_cut = "hold", level, False, False
        self._forget_failed(inp.now_s, heat_now)
        if est is None or self.samples_seen < c.min_samples:
            why = f"waiting for samples ({self.samples_seen}/{c.min_samples})"
        elif severe and can_cut:
            kind, after, latency_cut = "halve", max(c.floor, running // 2), True
            why = (
                f"{inp.failed_canaries} failed canary(ies) count as violations"
                if inp.failed_canaries
                else f"a chat TTFT of {worst:.0f} ms is over {c.halve_ratio:g}×T"
            )
            if running != level:  # the halving is of what runs, not of the allowance
                why += f"; half of the {running} batch running"
        elif est > c.cut_ratio * t and can_cut:
            factor = max(c.max_cut_factor, c.cut_ratio * t / est)
            kind, after = "cut", max(c.floor, min(level - 1, math.floor(running * factor)))
            latency_cut = True
            why = f"p95≈{est:.0f} ms > {c.cut_ratio:g}×T"
            if running != level:
                why += f"; cut from the {running} batch running"
        elif (
            fall is not None
            and fall < c.clock_fall_cut
            and heat_now
            and can_cut
            and running > c.floor
            and not surge
        ):
            # Ahead of the latency signal: chat slows as the clock does, and by the time the
            # estimate shows it the minute is lost. It counts as a latency cut: what ran is
            # what the card could not carry at this clock.
            kind, after = "cut", max(c.floor, min(level - 1, math.floor(running * fall)))
            latency_cut = True
            why = (
                f"the clock fell to {fall:.2f} of its busiest in the last minute under a "
                "thermal slowdown: what runs cut by as much, before chat shows it"
            )
            # The next cut for a fall counts from here, not from the clock before this one.
            self.clocks.clear()
        elif slot_room is not None and level > slot_room and running > slot_room:
            kind, after, load_cut = "cut", slot_room, True
            why = f"chat holds {inp.chat_inflight} of the engine's {c.engine_slots} slots"
        elif map_cut is not None and map_cut.allowance is not None and running > map_cut.allowance:
            # Ahead of time: the card has moved into a hotter state, and the map says what
            # that state takes; cut before chat slows, not after.
            kind, after = "cut", max(c.floor, map_cut.allowance)
            self.map_used = describe(map_cut)
            now = (
                f"the card is now {map_cut.state}"
                if eta is None
                else f"the card heads for its slowdown temperature in ~{eta:.0f} s"
            )
            why = f"{now}; headroom row: {self.map_used}"
            if eta is not None:
                self.ahead_level = after
        elif shed_to is not None and level > shed_to:
            # Little's law: chat's share of the engine grows with its arrival rate; shed
            # batch in proportion before the queue shows it.
            kind, after, load_cut = "cut", shed_to, True
            why = f"chat arriving at {surge:.1f}× its usual rate: shed batch ahead of the queue"
        elif est >= c.grow_ratio * t:
            why = (
                f"p95≈{est:.0f} ms in the dead band"
                if est <= c.cut_ratio * t
                else f"p95≈{est:.0f} ms over {c.cut_ratio:g}×T, the last cut still draining"
            )
        elif self.good_streak < c.grow_after_samples:
            why = f"p95≈{est:.0f} ms low for {self.good_streak} sample(s) only"
        elif inp.now_s - self.last_change_s < c.grow_cooldown_s:
            why = f"p95≈{est:.0f} ms low, in cooldown after the last change"
        elif surge:
            why = "chat still arriving faster than usual: no probing upward"
        elif (
            self.ahead_level is not None
            and level >= self.ahead_level
            and not heat_now
            and not self._map_grow_pending(level)
        ):
            why = (
                f"p95≈{est:.0f} ms low, held at the hot row {self.ahead_level} until the card "
                f"is {c.headroom_cool_margin_c:g} °C under its slowdown temperature"
            )
        elif eta is not None and not self._map_grow_pending(level):
            why = f"the card heads for its slowdown temperature in ~{eta:.0f} s: no growing into it"
        elif heat_not_load:
            why = "chat arrivals up under a thermal slowdown: read as heat, not load"
        else:
            kind, after, why = self._grow(level, est, inp, throttled, heat_now)
        if after > level:
            self.grow_times.append(inp.now_s)
            if kind == "grow" and self.map_used is not None:
                why += f"; headroom row: {self.map_used}"
        if (
            after < level
            and latency_cut
            and not surge
            and c.cut_memory_s > 0
            and (heat_now or not c.cut_memory_hot_only)
        ):
            # What ran when chat slowed: regrowing to it brings the same slowdown back a
            # minute or two later (hr-fans-stall-twice: 16 → 10 → 16 → cut, a missed window
            # each time). A lower level failing too lowers it.
            failed = running if self.failed is None else min(running, self.failed[0])
            self.failed = (failed, inp.now_s, self.map_state)
        if after < level:
            self.map_grow_to = None
            self.last_cut_s = inp.now_s
            if not load_cut:
                self.regrow_to = None
            self.good_streak = 0
            # Samples from before a cut tell of the old allowance: the next cut is judged
            # on what the new one does.
            self.window.clear()
            # A shed for load is not news about heat: the frozen ceiling stays where heat
            # put it, or a burst shed during a heat-up would hold the allowance that low
            # until the clocks settle.
            if self.frozen_ceiling is not None and not load_cut:
                self.frozen_ceiling = min(self.frozen_ceiling, after)
        if after != level:
            self.last_change_s = inp.now_s
        self.allowance = after
        head = f"{kind} {before} → {after}" if after != before else f"{kind} {after}"
        inputs = self._inputs(inp, est, worst, throttled, drop, surge)
        inputs["thermal_state"] = self.map_state
        inputs["headroom_row"] = self.map_used
        self.map_used = None
        return ControlAction(inp.now_s, before, after, f"{head}: {why}", inputs, est, kind)

    def _grow(
        self, level: int, est: float, inp: ControlInput, throttled: bool, heat_now: bool
    ) -> tuple[str, int, str]:
        c = self.config
        fast = c.grow_fast_below > 0 and est < c.grow_fast_below * c.target_p95_ms
        regrowing = self.regrow_to is not None and level < self.regrow_to
        fast = fast or regrowing
        step = max(1, math.ceil((c.grow_fast_fraction if fast else c.grow_fraction) * level))
        limit, why_limit = c.ceiling, f"the ceiling {c.ceiling}"
        if self.frozen_ceiling is not None and self.frozen_ceiling < limit:
            limit = self.frozen_ceiling
            if c.freeze == "falling":
                # Frozen while the clock falls, released once it has held: a card settled at a
                # lower clock may grow again, so "while throttled" would be untrue of it.
                why_limit = (
                    "the ceiling frozen while the clock falls under heat"
                    if self.settled_since_s is None
                    else f"the ceiling frozen until the clock has held for {c.freeze_release_s:g} s"
                )
            else:
                why_limit = (
                    "the ceiling frozen while the card is throttled"
                    if throttled
                    else "the ceiling frozen until the clocks have settled"
                )
        hot_cap_cool = (
            c.surge_cap_hot_only
            and self.surge_cap_heat is not None
            and self.surge_cap_heat[0]
            and not heat_now
        )
        if self.surge_cap is not None and self.surge_cap < limit and not hot_cap_cool:
            limit, why_limit = self.surge_cap, "the level chat surges were met from"
        if c.engine_slots and c.slot_reserve > 0 and self.chat_usual is not None:
            room = c.engine_slots - math.ceil(c.slot_reserve * self.chat_usual)
            if room < limit:
                limit, why_limit = max(c.floor, room), "the engine's slots a chat burst needs"
        # Growth past the slot cut's line at chat's usual peaks is taken back at the next
        # peak and regrown after it: a cut and a grow each time chat's in-flight count rises
        # (team-arrives-long-outputs: 137 of its 197 changes an hour). Where the gateway
        # holds the line itself, it does so without a write.
        if (
            c.engine_slots
            and c.slot_margin >= 0
            and not c.serving_slots
            and c.slot_peak_s > 0
            and self.chat_seen
        ):
            seen = sorted(n for _, n in self.chat_seen)
            peak = seen[min(len(seen) - 1, int(c.slot_peak_quantile * len(seen)))]
            room = c.slot_line - peak
            if room < limit:
                limit, why_limit = max(c.floor, room), "the engine's slots chat has held lately"
        failing = self._failing_level(inp, level)
        if failing is not None and failing - 1 < limit:
            limit = max(c.floor, failing - 1)
            why_limit = (
                f"the {self.map_state} headroom map: chat surely misses the SLO's minutes at "
                f"{failing}+ batch requests"
            )
            left = self._seed_counts_s(inp.now_s)
            if left is not None and any(o.state == self.map_state for o in self.map_prior):
                why_limit += f" (earlier days' answers counted for another {left / 60:.0f} min)"
        if self.failed is not None and self.failed[0] - 1 < limit:
            limit = max(c.floor, self.failed[0] - 1)
            why_limit = f"one under the {self.failed[0]} batch requests chat slowed at"
        if c.grow_to_demand and inp.batch_inflight is not None and inp.batch_queued is not None:
            # Room the batch job does not ask for buys nothing and lets a burst of it in.
            demand = inp.batch_inflight + inp.batch_queued
            if demand < limit:
                limit, why_limit = max(c.floor, demand), f"the batch job's demand {demand}"
        hard_limit = limit
        if c.max_grows_per_h > 0:
            while self.grow_times and self.grow_times[0] <= inp.now_s - 3600.0:
                self.grow_times.popleft()
            if len(self.grow_times) >= c.max_grows_per_h:
                return (
                    "hold",
                    level,
                    f"p95≈{est:.0f} ms low, {len(self.grow_times)} grows this hour",
                )
        if c.app_limited_headroom > 0 and inp.batch_inflight is not None:
            room = max(
                c.app_limited_headroom, math.ceil(c.app_limited_fraction * inp.batch_inflight)
            )
            used = inp.batch_inflight + room
            if used < limit:
                limit, why_limit = used, f"in-flight {inp.batch_inflight} + headroom"
        after = min(level + step, limit)
        if (
            self.regrow_to is not None
            and regrowing
            and self.regrow_at_once
            and self._chat_as_usual(inp)
            # The level a surge was shed from was the cool card's: in a thermal slowdown the
            # way back is step by step, as the hot card shows it can take it.
            and not heat_now
        ):
            # The serving layer lets them in a request at a time: no prefill stampede for
            # the headroom to pace, and one write instead of a step every cooldown.
            after = min(self.regrow_to, hard_limit)
        if self.map_grow_to is not None and self.map_grow_to > level:
            # The card has cooled into a state the map knows: back to what it takes there in
            # one write; the serving layer's ramp lets it in a request at a time.
            after = max(after, min(self.map_grow_to, hard_limit))
            self.map_used = self.map_grow_row
            if after >= self.map_grow_to:
                self.map_grow_to = None
        if after <= level:
            kind = "freeze" if limit == self.frozen_ceiling else "hold"
            return kind, level, f"p95≈{est:.0f} ms low, held at {why_limit}"
        return "grow", after, f"p95≈{est:.0f} ms < {c.grow_ratio:g}×T"

    def _failing_level(self, inp: ControlInput, level: int) -> int | None:
        """The first level of the lowest group at or above `level`'s own that the map is sure
        fails in the current thermal state (`map_fail_cap`); None where there is none."""
        state = self.map_state
        if not self.config.map_fail_cap or state is None or state not in STATES:
            return None
        # The seed from earlier days counts only while this run's own answers of that age
        # would still be in the map: a level it capped for good would never be tried again.
        seeded = self._seed_counts_s(inp.now_s) is not None
        key = (state, seeded)
        cached = self.fail_levels
        if cached is None or cached[0] != key or inp.now_s - cached[1] >= FAIL_LEVELS_EVERY_S:
            obs = self._not_busier(self._map_obs(state, prior=seeded))
            rate = self.surge.usual.rate
            counted = inp.chat_arrivals is not None  # the serving layer counts chat
            per_minute = round(rate * 60.0) if counted and rate else 0
            groups = groups_of(obs, self.config.target_p95_ms, share_for(per_minute))
            fails = tuple(
                (g.lo, g.hi)
                for g in groups
                if g.verdict == "fails" and g.sure and g.over >= self.config.map_fail_min_over
            )
            cached = self.fail_levels = (key, inp.now_s, fails)
        # Groups below the level's own are left out: the few minutes after a burst's shed
        # fill them with the burst's slow answers.
        return next((lo for lo, hi in cached[2] if hi >= level), None)

    def _seed_counts_s(self, now_s: float) -> float | None:
        """How long the earlier days' answers still count for the fail cap; None: they do not."""
        at = self.map_prior_at
        if not self.config.map_fail_cap_seed or at is None:
            return None
        left = at + self.config.headroom_memory_s - now_s
        return left if left > 0 else None

    def _forget_failed(self, now_s: float, heat_now: bool) -> None:
        """Let growth past the last latency cut's level once `cut_memory_s` has passed, or the
        card has moved into a cooler thermal state than the one it was cut in."""
        if self.failed is None:
            return
        _, at_s, state = self.failed
        cooler = (
            state in STATES
            and self.map_state in STATES
            and STATES.index(self.map_state) < STATES.index(state)
        )
        gone = self.config.cut_memory_hot_only and not heat_now
        if cooler or gone or now_s - at_s >= self.config.cut_memory_s:
            self.failed = None

    def _retest_surge_cap(self, inp: ControlInput, heat_now: bool) -> None:
        """Drop a learned surge cap once the card has been cooler than when it was learned
        for `surge_cap_retest_s`, or no surge has come for as long: the next surge then
        judges it anew."""
        c = self.config
        if self.surge_cap is None or c.surge_cap_retest_s <= 0:
            return
        # A cap is learned, or raised, as a surge ends: the last surge seen is at least as
        # recent as the cap.
        last = self.last_surge_s
        if self.surge_seed_at is not None:
            last = max(last, self.surge_seed_at)
        if c.surge_cap_quiet_retest and inp.now_s - last >= c.surge_cap_retest_s:
            self._drop_surge_cap()
            return
        if self.surge_cap_heat is None:
            return
        was_hot, was_ratio = self.surge_cap_heat
        ratio = None if inp.gpu is None else inp.gpu.clock_ratio
        cooler = (was_hot and not heat_now) or (
            ratio is not None and was_ratio is not None and ratio >= was_ratio + 0.02
        )
        if not cooler:
            self.surge_cap_gone_since = None
            return
        if self.surge_cap_gone_since is None:
            self.surge_cap_gone_since = inp.now_s
        elif inp.now_s - self.surge_cap_gone_since >= c.surge_cap_retest_s:
            self._drop_surge_cap()

    def _drop_surge_cap(self) -> None:
        self.surge_cap = None
        self.surge_missed_at = None
        self.surge_seeded, self.surge_seed_at = False, None
        self.surge_cap_heat = None
        self.surge_cap_gone_since = None

    def _map_observe(self, inp: ControlInput, values: list[float]) -> tuple[str, str] | None:
        """Keep the map's samples; return (from, to) when the thermal state has moved."""
        c = self.config
        if not c.headroom or inp.gpu is None:
            return None
        state, ratio = inp.gpu.state, inp.gpu.clock_ratio
        if inp.batch_inflight is not None:
            self.map_samples.extend(
                (inp.now_s, v, inp.batch_inflight, state, ratio, self.chat_rate) for v in values
            )
        while self.map_samples and self.map_samples[0][0] < inp.now_s - c.headroom_memory_s:
            self.map_samples.popleft()
        if self.map_candidate is None or self.map_candidate[0] != state:
            self.map_candidate = (state, inp.now_s)
        if state == self.map_state or inp.now_s - self.map_candidate[1] < c.headroom_dwell_s:
            return None
        before, self.map_state = self.map_state, state
        return None if before is None else (before, state)

    def _chat_rate(self, inp: ControlInput, values: list[float], dt: float) -> float | None:
        """Chat's arrivals a second over the last CHAT_RATE_WINDOW_S; None until half of that
        has been seen. Arrivals where the serving layer counts them, else the answers."""
        arrivals = len(values) if inp.chat_arrivals is None else inp.chat_arrivals
        if dt > 0:
            self.chat_counts.append((inp.now_s, arrivals, dt))
        while self.chat_counts and self.chat_counts[0][0] <= inp.now_s - CHAT_RATE_WINDOW_S:
            self.chat_counts.popleft()
        span = sum(d for _, _, d in self.chat_counts)
        if span < CHAT_RATE_WINDOW_S / 2:
            return None
        return sum(k for _, k, _ in self.chat_counts) / span

    def _map_obs(self, state: str, *, prior: bool = True) -> list[Observation]:
        """The map's observations in `state`, with the earlier days' where `prior`."""
        obs = [
            Observation(v, n, st, clock_ratio=k, chat_per_s=r)
            for _, v, n, st, k, r in self.map_samples
            if st == state
        ]
        return [o for o in self.map_prior if o.state == state] + obs if prior else obs

    def _not_busier(self, obs: list[Observation]) -> list[Observation]:
        """`obs` less the answers of chat that arrived at over `map_rate_band` times its rate
        now, where both rates are known: a level failing under busier chat may hold now, and
        one failing under calmer chat fails now too."""
        band, now = self.config.map_rate_band, self.chat_rate
        if band <= 1 or not now:
            return obs
        return [o for o in obs if o.chat_per_s is None or o.chat_per_s <= now * band]

    def _clock_fall(self, inp: ControlInput) -> float | None:
        """The busy SM clock as a share of its busiest of the last minute; None when off,
        idle or unknown."""
        gpu = inp.gpu
        ratio = None if gpu is None else gpu.busy_clock_ratio
        if self.config.clock_fall_cut <= 0 or ratio is None:
            return None
        self.clocks.append((inp.now_s, ratio))
        while self.clocks[0][0] < inp.now_s - CLOCK_FALL_WINDOW_S:
            self.clocks.popleft()
        top = max(r for _, r in self.clocks)
        return ratio / top if top > 0 else None

    def _heat_eta(self, inp: ControlInput) -> float | None:
        """Seconds until the card reaches where its clocks fall, at the pace of the last
        minute (0 once there); None unless it is within WARM_MARGIN_C of it and rising to it
        within `heat_eta_s`, or once a thermal slowdown bit says the heat has arrived."""
        c, gpu = self.config, inp.gpu
        if c.heat_eta_s <= 0 or gpu is None or gpu.temp_c is None:
            return None
        self.temps.append((inp.now_s, gpu.temp_c))
        while self.temps and self.temps[0][0] < inp.now_s - HEAT_PACE_S:
            self.temps.popleft()
        onset = gpu.temp_slowdown_c
        if onset is None or gpu.has(THERMAL_MASK) or gpu.temp_c < onset - WARM_MARGIN_C:
            return None
        if gpu.temp_c >= onset:
            return 0.0  # there, and the driver has not pulled the clock yet
        t0, temp0 = self.temps[0]
        if inp.now_s - t0 < HEAT_PACE_S / 2:
            return None
        pace = (gpu.temp_c - temp0) / (inp.now_s - t0)  # °C/s
        if pace <= 0:
            return None
        eta = (onset - gpu.temp_c) / pace
        return eta if eta <= c.heat_eta_s else None

    def _map_grow_pending(self, level: int) -> bool:
        return self.map_grow_to is not None and self.map_grow_to > level

    def _map_row(self, state: str, clock_min: float = 0.0) -> StateRow | None:
        """The map's row for `state`, where it is sure or fairly sure of an answer; with
        `clock_min`, from the answers at a clock of at least that share (or none known)."""
        # Each state's row is decided from its own observations alone: the others need no map.
        obs = self._map_obs(state)
        if clock_min > 0:
            obs = [o for o in obs if o.clock_ratio is None or o.clock_ratio >= clock_min]
        row = next(iter(headroom_map(obs, self.config.target_p95_ms)), None)
        if row is None or row.allowance is None or row.confidence == "not enough data":
            return None
        return row

    def _map_move(
        self, moved: tuple[str, str], level: int, gpu: GpuState | None
    ) -> StateRow | None:
        """On a move to a hotter state, the row to cut to; on a move to a cooler one, set
        what to grow back to. Only rows the map is sure or fairly sure of count."""
        before, after = moved
        if before not in STATES or after not in STATES:
            return None
        row = self._map_row(after)
        if row is None or row.allowance is None:
            return None
        if STATES.index(after) > STATES.index(before):
            if row.bound in ("exact", "at most") and row.allowance < level:
                return row
            return None
        if self._resting_at_limit(gpu):
            # The clock came back because the cut took the load away, not because the card
            # cooled: growing to the cooler row heats it straight back into slowdown
            # (hr-fans-stall-twice: 0 → 12 → cuts to 0, every two minutes, while the fans
            # were stalled).
            return None
        if row.bound in ("exact", "at least") and row.allowance > level:
            self.map_grow_to = row.allowance
            self.map_grow_row = self.map_used = describe(row)
            # The card is cooler than when the ceiling froze, and the map knows this state.
            self.frozen_ceiling = None
            self.settled_since_s = None
        return None

    def _resting_at_limit(self, gpu: GpuState | None) -> bool:
        if gpu is None or gpu.temp_c is None or gpu.temp_slowdown_c is None:
            return False
        return gpu.temp_c > gpu.temp_slowdown_c - self.config.headroom_cool_margin_c

    def _chat_as_usual(self, inp: ControlInput) -> bool:
        """Chat arrives and runs as usual again: the surge is over, not just learned as usual.

        A burst that lasts longer than its detector's memory stops counting as a surge
        while it still runs, so arrivals and chat in flight must be near usual too.
        """
        if self.surge.last_ratio >= 1.25:
            return False
        if inp.chat_inflight is None or self.chat_usual is None:
            return True
        return inp.chat_inflight <= max(2.0, 1.5 * self.chat_usual)

    def _inputs(
        self,
        inp: ControlInput,
        est: float | None,
        worst: float,
        throttled: bool,
        drop: float,
        surge: float,
    ) -> dict[str, Any]:
        gpu = inp.gpu
        ratio = None if gpu is None else gpu.clock_ratio
        return {
            "samples": len(inp.chat_ttfts_ms),
            "failed_canaries": inp.failed_canaries,
            "max_ttft_ms": round(worst, 1) if worst else None,
            "p95_est_ms": None if est is None else round(est, 1),
            "target_p95_ms": self.config.target_p95_ms,
            "throttle_reasons": None if gpu is None else gpu.throttle_reasons,
            "throttle_names": [] if gpu is None else reason_names(gpu.throttle_reasons),
            "clock_ratio": None if ratio is None else round(ratio, 3),
            "clock_drop": round(drop, 4),
            "throttled": throttled,
            "frozen_ceiling": self.frozen_ceiling,
            "chat_surge": round(surge, 2) if surge else None,
            "surge_cap": self.surge_cap,
            "batch_inflight": inp.batch_inflight,
            "chat_arrivals": inp.chat_arrivals,
            # The usual chat rate the surge test compares with, where the serving layer
            # counts chat (canaries alone are not the chat a minute's p95 is judged on).
            "chat_usual_per_s": (
                None
                if inp.chat_arrivals is None or self.surge.usual.rate is None
                else round(self.surge.usual.rate, 4)
            ),
            # Chat's rate of the last two minutes, which the map's answers are read at.
            "chat_per_s": None if self.chat_rate is None else round(self.chat_rate, 4),
            "chat_inflight": inp.chat_inflight,
            "chat_usual_inflight": None if self.chat_usual is None else round(self.chat_usual, 2),
            "allowance_read_back": inp.allowance,
            "latency_only": gpu is None,
        }


def _count(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _real(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
