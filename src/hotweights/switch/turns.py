"""When a busy engine's turn ends for a model that waits (``turn_left_s``), the scheduler's clock: by request-seconds
waited (``fair``, ``fifo``), or by Aegaeon's deadlines (``deadline``: ``due``, what a wake and a park take); and with
``deadline``, who gets the GPU's time among engines awake together (``short_of_slack``, ``ahead_of``,
``not_due_s``, ``watch_s``). Pure functions of views and the config, as the rest of ``schedule.py``."""

from __future__ import annotations

import math

from .config import SwitchConfig
from .snapshot import Snapshot, View
from .states import ModelState

DEFAULT_WAKE_S = {True: 0.1, False: 1.0}  # a wake not yet measured: weights kept on the GPU, or from host memory
DEFAULT_PARK_S = 0.1  # a park not yet measured (an H100's held parks of an 8B: 0.05-0.07 s)
AHEAD_S = 1.0  # slack past a pause's own that ends a turn early (``far_ahead``; replayed, 0 to 2 s did alike)


def wake_cost(v: View) -> float:
    """What ``v``'s wake takes: its wakes lately, else a guess by where its parked weights are."""
    return v.wake_s if v.wake_s is not None else DEFAULT_WAKE_S[v.weights_kept]


def park_cost(v: View) -> float:
    """What ``v``'s park takes: its parks lately, else a guess."""
    return v.park_s if v.park_s is not None else DEFAULT_PARK_S


def token_deadline(arrived: float, first_at: float, tokens: int, config: SwitchConfig) -> float:
    """Aegaeon's deadline for a stream's next token (``time.monotonic()``): its first token's time and
    ``slo_token_s`` a token since (``tokens`` relayed), or where none came yet (in its prefill, or queued)
    ``slo_ttft_s`` after it came."""
    return first_at + config.slo_token_s * tokens if first_at else arrived + config.slo_ttft_s


def token_due(arrived: float, first_at: float, tokens: int, config: SwitchConfig) -> float:
    """When a stream's model is due awake for its next token (``time.monotonic()``): its ``token_deadline`` less one
    token's time, for its step and the relay (held streams woken for the deadline itself came back 0.01-0.05 s past
    it, 12 of 51 misses on an H100), or less ``first_token_s`` for a first token (its prefill, the relay)."""
    margin = config.slo_token_s if first_at else config.first_token_s
    return token_deadline(arrived, first_at, tokens, config) - margin


def slack_s(v: View, config: SwitchConfig, now: float) -> float:
    """How long ``v``'s streams in flight could pause before the first of them still on time is due (``token_due``;
    negative: it is due already; infinite with none that may pause). A stream past its ``token_deadline`` has missed
    it (a request with one late token misses Aegaeon's SLO): a pause costs it nothing more. Requests on their way to
    the engine (``View.coming``) count by their first tokens: without them an engine just woken for new requests
    had no stream on time, and was sent away as if behind (replayed with a 10 ms window between a request let in and
    its stream joining, ten 8B on an H200: Aegaeon's SLO 98.7% -> 99.2% at 0.1 req/s, ours 59.3% -> 66.7% at 0.5;
    on the CPU, three seeds paired, Aegaeon's SLO up in each: ``switch/coming_defer_cpu_2026-12-07.json``)."""
    clocks = [*v.clocks, *((a, 0.0, 0) for a in v.coming)]
    on_time = [token_due(*clock, config) for clock in clocks if token_deadline(*clock, config) >= now]
    return min(on_time, default=math.inf) - now


def _dues(v: View, config: SwitchConfig, now: float) -> list[tuple[float, bool]]:
    """Each waiting request of ``v``'s due time (``time.monotonic()``), and whether it is for a first token: a held
    stream's next token when its ``dues`` says, else a first token's (``token_due``). A held stream surely past its
    token's deadline has missed Aegaeon's SLO already (one late token misses it): it is due ``slo_ttft_s`` later, as
    a new request's first token is after it comes, so that streams still on time go first and it is not starved
    (replayed, ``benchmarks/switch_sim.py``: ten 8B on an H200 at 0.5 req/s, two awake, three seeds' means,
    Aegaeon's SLO 58.0% -> 62.2%, ours 60.7% -> 65.9%; first, the most overdue stream's model woke and the rest came
    due in turn)."""
    dues = v.dues or (None,) * len(v.arrivals)
    margin = max(config.slo_token_s, config.first_token_s)  # token_due's, the larger: never one still on time
    return [(token_due(a, 0.0, 0, config), True) if d is None else
            (d + config.slo_ttft_s if d + margin < now else d, False) for a, d in zip(v.arrivals, dues)]


def due(v: View, config: SwitchConfig, now: float) -> float:
    """When ``v`` is due awake for its first waiting request (``time.monotonic()``): a held stream's next token when
    its ``dues`` says (later where it has missed it: ``_dues``), else ``first_token_s`` (its prefill, the relay)
    before a first token ``slo_ttft_s`` after the request came; infinite with none waiting."""
    return min((d for d, _ in _dues(v, config, now)), default=math.inf)


def first_token_due(v: View, config: SwitchConfig, now: float) -> bool:
    """Whether ``v``'s first due time is a request's first token's, not a held stream's next one."""
    return min(_dues(v, config, now), default=(math.inf, False))[1]


def slack_kept_s(busy: View, away: float, config: SwitchConfig, now: float) -> float:
    """How long ``busy`` keeps its turn for its streams' slack where their pause takes ``away``: until each stream
    still on time that lacks the slack has it (``away`` less its slack, its tokens coming), or is past its
    ``token_deadline`` (then it has missed it: a pause costs it nothing more); the scheduler looks again then.
    Negative infinity where none lacks it. (On the CPU a stream queued behind another, 0.3 s from its first token's
    deadline, kept a turn for 4 s of a wake's pause it was late for after 0.01 s.)"""
    kept = -math.inf
    for clock in busy.clocks:
        late_in = token_deadline(*clock, config) - now
        slack = token_due(*clock, config) - now
        if late_in >= 0 and slack < away:
            kept = max(kept, min(away - slack, late_in))
    return kept


def away_s(busy: View, v: View) -> float:
    """How long ``busy``'s streams pause at least where its turn ends for ``v``: its park, ``v``'s wake and shortest
    turn (``v``'s wake and its own), ``v``'s park and its own wake."""
    return park_cost(busy) + 2 * wake_cost(v) + park_cost(v) + 2 * wake_cost(busy)


def round_trip_s(busy: View, v: View) -> float:
    """The shortest turn ``busy`` has, behind (no stream of it on time), where its turn ends for ``v``: what the
    switch and the one back take, its park, ``v``'s wake, ``v``'s park and its own wake (a turn shorter than its
    switches is all switch: Aegaeon's scale-down). With the two wakes alone (15 ms on the GPU tier, where a park takes
    56 ms), one engine at a time (``max_awake`` 1) and every stream late, each turn ended before its first step:
    replayed, ten 8B on an H200 at 0.5 req/s answered 9 of 329 requests in 200 s over 2,361 switches; all 329 with
    this. Where a stream is on time the two wakes stay the shortest: the round trip for all cost 0.7 points of
    Aegaeon's SLO at 0.1 req/s (ten seeds), the turns' ends coming late for the deadlines of others."""
    return park_cost(busy) + wake_cost(v) + park_cost(v) + wake_cost(busy)


def all_pause(v: View) -> bool:
    """Whether every request in flight on ``v`` is a stream that may pause (its clock known): a request let in at a
    wake has none until its engine's answer begins, and one that does not pause ends in flight, its engine leaving
    (on an H100, 14 leaves of a run waited 0.1-7.7 s for such requests, 43 s of an awake place in all)."""
    return bool(v.clocks) and len(v.clocks) == v.inflight


def far_ahead(busy: View, v: View, slack: float) -> bool:
    """Whether every request in flight on ``busy`` is a stream that may pause (``all_pause``) and those still on time
    (one at least: an engine whose streams are all late is behind, not ahead, and its turn ends by ``v``'s due) have the
    slack (``slack``: its ``slack_s``, which the caller has reckoned) for their pause where its turn ends for ``v``
    (``away_s``) and ``AHEAD_S`` more: with the ``deadline`` schedule its turn ends then, before ``v`` is due. Each
    decode step reads an engine's whole weights whatever its batch, so an engine that runs far ahead of its deadlines
    spends the GPU's time on steps of few streams; paused, its streams gather and later steps carry more of them, while
    ``v`` gets slack of its own early rather than at its due (replayed, ``benchmarks/switch_sim.py``: ten 8B on an H200
    at 0.1 req/s, two awake at a time, Aegaeon's SLO 96.2% -> 99.0%, ours 94.7% -> 98.7%)."""
    return all_pause(busy) and math.isfinite(slack) and slack >= away_s(busy, v) + AHEAD_S


def turn_left_s(busy: View, v: View, config: SwitchConfig, now: float) -> float:
    """Seconds until ``busy``'s turn ends for ``v``: once ``v``'s waiting requests have waited, in sum, ``turn_s`` per
    request in flight on ``busy`` (0 at once where one of them starves); with the ``deadline`` schedule, once ``v``'s
    first due time less its wake and ``busy``'s park has come, but not before ``busy`` has been awake as long as the
    two wakes its turn's end costs take (``v``'s now, its own when it comes back; where none of its streams is on
    time, the whole ``round_trip_s``), nor, where ``v`` is due for a first
    token, while ``busy``'s streams still on time have less slack than their pause would take (``away_s``,
    ``slack_kept_s``), for at most that long past ``v``'s due: a stream paused without slack misses its next token
    by Aegaeon's deadline, where a first token has Aegaeon's 10 s (20 of 51 misses on an H100 were streams paused
    with under 1 s of slack); and where ``busy`` is ``far_ahead`` of its deadlines, as soon as it has been awake
    that long."""
    if config.schedule == "deadline":
        slack = slack_s(busy, config, now)  # infinite where every stream is late: behind, not ahead
        least = busy.awake_at + (wake_cost(busy) + wake_cost(v) if math.isfinite(slack) else round_trip_s(busy, v))
        least -= now
        if far_ahead(busy, v, slack):
            return max(0.0, least)
        ends = due(v, config, now) - wake_cost(v) - park_cost(busy)
        kept = -math.inf
        if first_token_due(v, config, now):
            away = away_s(busy, v)
            kept = min(slack_kept_s(busy, away, config, now), ends + away - now)
        return max(0.0, ends - now, least, kept)
    if not v.arrivals:
        return config.turn_s
    if now - min(v.arrivals) > config.starve_after_s:
        return 0.0
    owed = config.turn_s * max(1, busy.inflight) - sum(now - a for a in v.arrivals)
    return max(0.0, owed / len(v.arrivals))


def short_of_slack(s: Snapshot, config: SwitchConfig) -> list[View]:
    """Awake engines whose streams still on time lack the slack for one pause of their own (``away_s``): with the
    ``deadline`` schedule, the GPU's time goes to them first (``ahead_of``, ``not_due_s``)."""
    if config.schedule != "deadline":
        return []
    return [v for v in s.models if v.state is ModelState.AWAKE and v.inflight
            and slack_s(v, config, s.now) < away_s(v, v)]


def watch_s(s: Snapshot, config: SwitchConfig) -> float | None:
    """With the ``deadline`` schedule and streams in flight that may pause, the plan looks again a token's time
    hence (``slo_token_s``): their slack changes with their tokens and the clock, and no event says so (who is
    ``short_of_slack``, and what ``ahead_of`` and ``not_due_s`` say, with it). None otherwise."""
    streams = config.schedule == "deadline" and any(v.state is ModelState.AWAKE and v.clocks for v in s.models)
    return config.slo_token_s if streams else None


def ahead_of(s: Snapshot, short: list[View], config: SwitchConfig) -> tuple[str, str] | None:
    """An awake engine that leaves the GPU's time to one ``short`` of slack beside it, and that one's name: the first
    whose streams all pause (``all_pause``), can hold, and have slack for its own round trip twice and the other's
    once, so that it comes back in time (``not_due_s``). Engines awake together share the GPU: each decode step reads
    its whole weights, so one engine far ahead of its deadlines slows one that is behind for tokens no one needs yet
    (replayed, ``benchmarks/switch_sim.py``: five 8B on an H100 at 0.5 req/s, Aegaeon's SLO 94.8% -> 98.6% with
    ``max_awake`` 2, 86.6% -> 97.2% with memory alone)."""
    for v in s.models:
        if v.state is not ModelState.AWAKE or not v.can_hold or v in short or not all_pause(v):
            continue
        slack = slack_s(v, config, s.now)  # once per engine, not per engine short beside it
        for n in short:
            if v.config.shares_a_gpu(n.config) and slack > 2 * away_s(v, n) + away_s(n, v):
                return v.name, n.name
    return None


def not_due_s(v: View, s: Snapshot, short: list[View], config: SwitchConfig) -> float:
    """Seconds until ``v``, waited for by held streams whose next tokens are not due yet, wakes beside an engine
    ``short`` of slack on its GPUs: at its due less its wake (0: at once; a first token, or none short beside it,
    does not wait)."""
    if first_token_due(v, config, s.now) or not any(v.config.shares_a_gpu(n.config) for n in short):
        return 0.0
    return max(0.0, due(v, config, s.now) - wake_cost(v) - s.now)
