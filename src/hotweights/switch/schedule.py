"""The switch's choices, as pure functions of one ``Snapshot`` (``snapshot.py``: frozen views of its models, the GPU
totals and the time) and the config: no engine, no clock, so that every rule is a table over views. ``plan`` says
what the scheduler does next (``Plan``: engines that leave, then a start, a wake, or a wait); ``Lifecycle`` only acts
on it, and a wake refused for memory is planned again (``victim``). Besides: which model a switch serves next, what
must make room for it, and when a request is answered 503 without a switch.

Which model: ``fair`` (the default) takes a model whose longest-waiting request has waited over ``starve_after_s``
first (the longest first), else the one with the most requests waiting (then the longest-waiting); ``fifo`` the
request that came first; ``deadline`` the model whose request is due first (``due``: a first token ``slo_ttft_s``
after its request came, its model awake ``first_token_s`` before, a held stream's next token ``slo_token_s`` a token
after its first: Aegaeon's deadlines).

Room (``room_for``): GPU memory bounds the awake set (``memory.py``), and ``max_awake``, where set, caps it per GPU.
An engine stays awake, serving its own requests, while its memory is not needed. A wake that fits beside the awake
engines goes at once; one that does not parks idle engines first, the least recently used first; then it waits for
engines already leaving; then, where memory forces a choice between busy engines, a busy engine's turn ends once the
requests waiting for the model have waited, in sum, ``turn_s`` per request it has in flight (a starving request ends
it at once): it leaves (takes no new request, parks once its requests end) and the model wakes after it. With the
``deadline`` schedule the turn ends instead once the model's first due time, less what its wake and the busy
engine's park take, has come, and never before the busy engine has been awake as long as the two wakes its turn's
end costs take, or with no stream on time its whole round trip (Aegaeon's scale-down, a turn shorter than its
switches is all switch; with its own wake alone, 15 ms on the GPU tier, every host-tier request that came due ended
a GPU-tier turn; ``turns.round_trip_s``), nor, for a first token, while the busy engine's streams lack
the slack for their pause (where they are far ahead of their deadlines, it ends as soon as that: ``far_ahead``); of
the busy engines whose turn is over, the one whose streams have the most slack leaves first (``turns.slack_s``); and
the GPU's time goes by deadline too: one far ahead of its deadlines leaves for one short of slack beside it
(``turns.ahead_of``). Nothing is parked or left for a wake that must wait anyway. A busy engine that leaves holds its
streams with their KV caches (its engine's park keeps them: ``View.can_hold``) where the wake fits beside what it
then keeps (``memory.Holder.kv_kept``), else its streams are continued from their tokens.

Start-up's starts (``startup_batch``): one at a time where a start profiles the GPU's memory (``GpuNeed.profiles``);
where none does (vLLM with ``--kv-cache-memory-bytes``), up to ``start_jobs`` models whose preloads are done start
together, as many as fit the GPU's memory all resident at once (an 8B vLLM start is ~20 s, most of it imports,
torch.compile's cache and CUDA graphs: ten one after another are over three minutes). A model whose preload ends
while they start joins them (``joining``), on the same terms, once the front's first engine is up (the first start
compiles), unless requests wait for a model that has started: the switches they need go first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .config import SwitchConfig
from .memory import held_mib, over_mib
from .snapshot import Snapshot, View
from .turns import ahead_of, due, not_due_s, short_of_slack, slack_s, turn_left_s, wake_cost, watch_s
from .states import SERVING, FailureKind, ModelState

S = ModelState


@dataclass(frozen=True)
class Room:
    """What a switch to a model does first: park ``park`` (idle), take ``leave`` (busy, their turn over) out of
    service (both by name; those of ``leave`` in ``keep`` park holding their streams with their KV caches);
    ``wait``: the model wakes only once the leaving engines have parked (or, with nothing to leave, a busy engine's
    turn ends in ``look_in_s``)."""

    park: tuple[str, ...] = ()
    leave: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    wait: bool = False
    look_in_s: float | None = None
    trial: bool = False  # it does not fit even alone by the estimate: only the model served next tries its wake

    @property
    def now(self) -> bool:
        """Nothing to park, leave or wait for, and it fits: the model wakes beside the others."""
        return not (self.park or self.leave or self.wait or self.trial)


@dataclass(frozen=True)
class Leave:
    """``name`` takes no new request and parks once its requests end: its turn is over, for ``For`` (``waiting`` of
    whose requests wait); ``keep``: its streams are held with their KV caches, else continued from their tokens;
    ``ahead``: it leaves the GPU's time to ``For``'s awake streams, its own ahead of their deadlines
    (``turns.ahead_of``)."""

    name: str
    for_: str
    waiting: int
    keep: bool = False
    ahead: bool = False


@dataclass(frozen=True)
class Start:
    """Start these models' engines (the first, and start-up's starts that go with it: ``startup_batch``)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Wake:
    """Make ``room`` and wake ``name`` (or start its engine again)."""

    name: str
    room: Room = Room()


@dataclass(frozen=True)
class Wait:
    """Nothing goes now: look again at the next change, or in ``look_in_s`` (a busy engine's turn ends)."""

    look_in_s: float | None = None


@dataclass(frozen=True)
class Plan:
    """What the scheduler does now: ``leave`` first (busy engines whose turn is over), then ``then``."""

    then: Start | Wake | Wait
    leave: tuple[Leave, ...] = ()


def plan(s: Snapshot, config: SwitchConfig) -> Plan:
    """The scheduler's next step: the first model requests wait for (by the schedule) starts, or wakes making room
    (busy engines whose turn is over leave for it, even where it must wait for them); a model after it wakes only
    where it fits with nothing moved (it takes no memory the first one waits for); with no request waiting,
    start-up's next start; else a wait, until the earliest end of a busy engine's turn."""
    order = wanted(s, config)
    look = watch_s(s, config)  # the deadline schedule: streams' slack changes with the clock
    leave: tuple[Leave, ...] = ()
    short = short_of_slack(s, config)  # the deadline schedule: the GPU's time to these first
    if short and (ahead := ahead_of(s, short, config)):
        leave = (Leave(ahead[0], ahead[1], 0, True, ahead=True),)
        s = s.moved(ahead[:1], S.LEAVING, ahead[:1])
    for i, v in enumerate(order):
        if not v.started or retried_now(v, s.now):
            if i == 0:
                return Plan(Start(startup_batch(v, s, config)), leave)
            continue
        if short and (wait := not_due_s(v, s, short, config)) > 0:
            look = wait if look is None else min(look, wait)
            continue
        room = room_for(v, s, config)
        if i == 0 and room.leave:
            leave += tuple(Leave(x, v.name, v.waiting, x in room.keep) for x in room.leave)
            s = s.moved(room.leave, S.LEAVING, room.keep)
        if not room.wait and (i == 0 or room.now):
            return Plan(Wake(v.name, room), leave)
        if room.look_in_s is not None:
            look = room.look_in_s if look is None else min(look, room.look_in_s)
    if order:
        return Plan(Wait(look), leave)
    return Plan(restart(s, config) or start_next(s, config, look), leave)


def restart(s: Snapshot, config: SwitchConfig) -> Wake | None:
    """A crashed engine of the default (or a kept-awake) model started again by itself (``restarts_now``), where it
    fits now (idle engines parked for it), else None."""
    for v in s.models:
        if restarts_now(v, s):
            room = room_for(v, s, config)
            if not room.wait:
                return Wake(v.name, room)
    return None


def start_next(s: Snapshot, config: SwitchConfig, look: float | None = None) -> Start | Wait:
    """Start-up's next start (``startup_next``), with the starts that go with it; else a wait, until the next change
    or the end of the earliest back-off of a start that failed or of a crashed engine started again by itself
    (``retry_in_s``: a timer's kick may come a hair before the back-off's end, and none comes after it), or ``look``
    seconds at most."""
    following = startup_next(s)
    if following is not None:
        return Start(startup_batch(following, s, config))
    return Wait(min((x for x in (retry_in_s(s), look) if x is not None), default=None))


def retry_in_s(s: Snapshot) -> float | None:
    """Seconds until the earliest back-off ends of a model the scheduler tries again by itself (a failed start, or
    a crashed engine of the default or a kept-awake model), None where none waits for one."""
    left = [f.retry_at - s.now for v in s.models if (f := v.failure) is not None and v.state is ModelState.FAILED
            and not v.waiting and (f.kind is FailureKind.START or v.name == s.default or v.config.keep_awake)
            and f.retry_at > s.now]
    return min(left) + 0.01 if left else None


def wanted(s: Snapshot, config: SwitchConfig) -> list[View]:
    """Models requests wait for that a switch may serve, the next first (by the schedule); a model whose engine left
    for another (``View.left_for``) comes after it while it waits: its paused streams, waiting again, would otherwise
    take back the place its turn's end gave (more of them than the other's requests, or due sooner)."""
    now = s.now
    found = [v for v in s.models
             if v.waiting > v.reserved and v.state not in (S.AWAKE, S.LEAVING) and not refusal(v, now)]
    if config.schedule == "fifo":
        found.sort(key=lambda v: -v.waited_s(now))
    elif config.schedule == "deadline":
        found.sort(key=lambda v: (due(v, config, now), -v.waited_s(now)))
    else:
        found.sort(key=lambda v: (v.waited_s(now) <= config.starve_after_s,
                                  -(v.waited_s(now) if v.waited_s(now) > config.starve_after_s else 0),
                                  -(v.waiting - v.reserved), -v.waited_s(now)))
    names = {v.name for v in found}
    return sorted(found, key=lambda v: v.left_for in names)


def next_model(s: Snapshot, config: SwitchConfig) -> View | None:
    """The model to start or switch to next: one requests wait for (by the schedule), else the next one start-up
    has not reached (``startup_order``), else one whose start failed and may be tried again, else None."""
    first = wanted(s, config)
    return first[0] if first else startup_next(s)


def startup_next(s: Snapshot) -> View | None:
    """The next model start-up has not reached (an eager one: a cached or lazy one starts for its first request),
    else one whose start failed and may be tried again, else None."""
    left = [v for v in startup_order(s) if not v.started and v.config.start == "eager"]
    left = left or [v for v in s.models if retried_now(v, s.now)]
    return left[0] if left else None


def startup_order(s: Snapshot) -> list[View]:
    """The order start-up takes the models in: the default, then those whose parked weights go to host memory
    (``parked_weights = "host"``), then the rest, each group as configured. A host-tier engine's weights leave the
    GPU once it has started and parked, so its preload (which holds them on the GPU, twice at its peak) finds more
    room early than late, when every GPU-tier model's weights are there: ten 8B vLLM models, six of them on the GPU
    tier, fit an H200 in this order and not in the configured one (the seventh preload would need 34 GiB where
    30 are free)."""
    default = s[s.default]
    rest = [v for v in s.models if v.name != s.default]
    return [default, *sorted(rest, key=lambda v: v.config.parked_weights != "host")]


def retried_now(v: View, now: float) -> bool:
    """Whether ``v``'s start failed and its back-off is over (or its files changed): start-up tries it again by
    itself, no request needed (a default that failed once would otherwise leave ``/health`` at 503 until a request
    came, and a health-gated deployment sends none)."""
    return (v.state is ModelState.FAILED and v.failure is not None and v.failure.kind is FailureKind.START
            and not v.waiting and not refusal(v, now))


def restarts_now(v: View, s: Snapshot) -> bool:
    """Whether ``v``'s engine died while it served and the scheduler starts it again itself now, no request needed:
    it is the default model (``/health`` waits for it, and a health-gated deployment sends no request) or kept
    awake, and the back-off its crashes earned is over (``lifecycle.Lifecycle.exited``)."""
    f = v.failure
    return (v.state is ModelState.FAILED and f is not None and f.kind is FailureKind.DIED
            and (v.name == s.default or v.config.keep_awake) and s.now >= f.retry_at)


def pick_victim(candidates: Sequence[View], schedule: str) -> View:
    """The awake engine to park for another where its own wake says the GPU has too little (the memory model's
    estimate was short)."""
    if schedule == "fifo":
        return min(candidates, key=lambda x: x.last_used)
    return min(candidates, key=lambda x: (x.inflight > 0, x.last_used))


def victim(s: Snapshot, keep: str, config: SwitchConfig) -> str | None:
    """A wake of ``keep`` refused for memory, planned again: the awake engine beside it (not kept awake) to park
    first, None where there is none."""
    v = s[keep]
    candidates = [x for x in s.models if x.state is S.AWAKE and x.name != keep and x.config.shares_a_gpu(v.config)
                  and not x.config.keep_awake]
    return pick_victim(candidates, config.schedule).name if candidates else None


def fits(v: View, s: Snapshot, config: SwitchConfig, gone: Sequence[str] = (), kept: Sequence[str] = ()) -> bool:
    """Whether ``v`` awake fits beside the others, those named in ``gone`` parked (those in ``kept`` keeping their KV
    caches, a leaving one as it leaves): ``max_awake`` (where set) and each of its GPUs' memory."""
    beside = [x for x in s.models if x.name != v.name and x.config.shares_a_gpu(v.config)]
    if config.awake_cap and sum(x.state in (S.AWAKE, S.LEAVING) and x.name not in gone
                                for x in beside) >= config.awake_cap:
        return False
    holders = [v.holder(S.AWAKE), *(x.holder(S.PARKED if x.name in gone else None, True if x.name in kept else None)
                                    for x in s.models if x.name != v.name)]
    return all(over_mib(g, s.totals[g], holders) <= 0 for g in v.need.gpus if g in s.totals)


def room_for(v: View, s: Snapshot, config: SwitchConfig) -> Room:
    """What must make room for ``v`` to wake: see the module's docstring."""
    now = s.now
    if fits(v, s, config):
        return Room()
    beside = [x for x in s.models if x.name != v.name and x.config.shares_a_gpu(v.config)]
    movable = [x for x in beside if x.state is S.AWAKE and not x.config.keep_awake]
    idle = [x.name for x in sorted((x for x in movable if not x.inflight), key=lambda x: x.last_used)]
    for i in range(1, len(idle) + 1):
        if fits(v, s, config, idle[:i]):
            return Room(park=tuple(idle[:i]))
    gone = [*idle, *(x.name for x in beside if x.state is S.LEAVING)]
    if len(gone) > len(idle) and fits(v, s, config, gone):
        return Room(wait=True)  # the leaving engines will do; the idle ones park then if still needed
    left = {x.name: turn_left_s(x, v, config, now) for x in movable if x.inflight}  # each busy engine's turn
    busy = sorted(left, key=lambda x: (left[x], s[x].last_used))
    over = [x for x in busy if left[x] <= 0]
    if config.schedule == "deadline":  # of those, the one whose streams can wait longest (its wake back counted)
        over.sort(key=lambda x: wake_cost(s[x]) - slack_s(s[x], config, now))
    leaving = leavers(v, s, config, gone, over)
    if leaving is not None:
        return leaving
    if busy and fits(v, s, config, [*gone, *busy]):  # once more turns end
        return Room(wait=True, look_in_s=min(left[x] for x in busy if x not in over))
    return trial(v, s, config, idle, leaving=len(gone) > len(idle))


def trial(v: View, s: Snapshot, config: SwitchConfig, idle: Sequence[str], leaving: bool) -> Room:
    """Room for ``v``, which by the estimate does not fit even alone: its own wake says (the estimate may be short),
    every idle engine parked, once those leaving have parked, within ``max_awake``; only as the model served next
    (``Room.trial``: after it, it woke past ``max_awake`` 1 on an H100, refused for memory 42 times a minute)."""
    capped = room_for(v, dataclasses.replace(s, totals={}), config) if s.totals else Room()  # memory aside
    return Room(park=tuple(idle), leave=capped.leave, keep=capped.keep, wait=capped.wait or leaving,
                look_in_s=capped.look_in_s, trial=True)


def leavers(v: View, s: Snapshot, config: SwitchConfig, gone: Sequence[str], over: Sequence[str]) -> Room | None:
    """Few of ``over`` (busy engines whose turn is over, in turn order) whose leaving makes room for ``v``, two ways:
    those that can hold their streams with their KV caches first, holding them, then the others; or all letting
    their KV caches go (their streams continued from their tokens); each way those that free the most of ``v``'s
    GPUs first. The way with fewer leaving, else the one that holds more. One that frees nothing leaves only where
    ``max_awake`` counts it (three GPU-tier engines holding their streams left for one host-tier wake on an H100,
    none of them needed). None where all of them leaving does not make room. With the ``deadline`` schedule, where
    one leaving makes room, the first in turn order that does (the most slack: on an H100 a host-tier engine with 13
    streams left for a GPU-tier wake, freeing more than the cap needed, where a GPU-tier engine with 2-3 and a wake
    back of 7 ms could have), one that holds its streams first."""
    if config.schedule == "deadline":
        for hold in (True, False):
            for x in over:
                if (s[x].can_hold or not hold) and fits(v, s, config, [*gone, x], [x] if hold else []):
                    return Room(leave=(x,), keep=(x,) if hold else (), wait=True)
    rooms = []
    for hold in (True, False):
        holds = {x for x in over if hold and s[x].can_hold}
        freed = {x: _freed_mib(s[x], v, s, x in holds) for x in over}
        chosen: list[str] = []
        for x in sorted(over, key=lambda x: (x not in holds, -freed[x])):  # stable: of equals, turn order
            if freed[x] <= 0 and not config.awake_cap:
                continue
            chosen.append(x)
            if fits(v, s, config, [*gone, *chosen], [y for y in chosen if y in holds]):
                rooms.append(Room(leave=tuple(chosen), keep=tuple(y for y in chosen if y in holds), wait=True))
                break
    return min(rooms, key=lambda r: (len(r.leave), -len(r.keep)), default=None)


def _freed_mib(x: View, v: View, s: Snapshot, held: bool) -> int:
    """What ``x`` parking (its KV cache kept where ``held``) frees on ``v``'s GPUs, MiB."""
    return sum(held_mib(x.holder(), s.totals[g]) - held_mib(x.holder(S.PARKED, held), s.totals[g])
               for g in v.need.gpus if g in s.totals and g in x.need.gpus)


def refusal(v: View, now: float) -> str:
    """Why a request for ``v`` is answered 503 now without a switch ("" when a switch may serve it): its start
    failed, the back-off has not passed and its checkpoint's files are as they were."""
    f = v.failure
    if v.state is not ModelState.FAILED or f is None or f.kind is not FailureKind.START:
        return ""
    left = f.retry_at - now
    if left <= 0 or v.files_changed:
        return ""
    return f"{f.message} (tried again in {left:.0f} s, or at once when its checkpoint's files change)"


def startup_batch(first: View, s: Snapshot, config: SwitchConfig) -> tuple[str, ...]:
    """The models start-up starts together with ``first`` (itself first): where start-up's preloads run ahead of the
    starts and no start among them profiles the GPU's memory, the next eager models start-up has not reached whose
    preloads are done, in start-up order, up to ``start_jobs`` in all, each only where every GPU of its holds it and
    all those before it resident (``memory.over_mib``) beside the others as they are and the peaks of the preloads
    running. Just ``first`` otherwise."""
    if first.started or config.start_jobs <= 1 or not s.preloads_ahead or first.need.profiles:
        return (first.name,)
    return (first.name, *joining((first.name,), s, config.start_jobs))


def joining(starting: Sequence[str], s: Snapshot, jobs: int) -> list[str]:
    """The models whose starts join ``starting`` (start-up's starts going on, or about to): as ``startup_batch``
    says, up to ``jobs`` starts in all; none where one of ``starting`` profiles the GPU's memory, until its profile
    is done (``View.profiled``)."""
    if any(s[x].need.profiles and not s[x].profiled for x in starting):
        return []
    batch = list(starting)
    for v in startup_order(s):
        if len(batch) >= jobs:
            break
        if (v.name in batch or v.started or v.config.start != "eager" or v.state is not S.STARTING
                or v.need.profiles or not v.need.gpus or not v.preloaded):
            continue
        holders = [x.holder(S.STARTING if x.name in batch or x is v else None) for x in s.models]
        if all(over_mib(g, s.totals[g], holders) + s.preloading.get(g, 0) <= 0 for g in v.need.gpus if g in s.totals):
            batch.append(v.name)
    return batch[len(starting):]


def may_join(starting: Sequence[str], s: Snapshot, config: SwitchConfig) -> bool:
    """Whether models may join ``starting`` now (``joining`` says which): not where those are not start-up's starts,
    before the front's first engine is up unless its code was compiled ahead or the first start has compiled it by
    now (the first start of an architecture compiles it, 74.9 s for an 8B on an H200 against 16-37 s for the starts
    after it, which load the compiled code: one beside it before that would compile too; every start waits for a
    compile ahead still running), nor while requests wait for a model that has started (the switch they need goes
    first)."""
    views = [s[x] for x in starting]
    return not (not views or any(v.state is not S.STARTING for v in views) or config.start_jobs <= 1
                or not s.preloads_ahead
                or (not any(v.state in SERVING for v in s.models) and s.first_start_compiles
                    and not any(v.compiled for v in views))
                or any(v.started and v.name not in starting for v in wanted(s, config)))
