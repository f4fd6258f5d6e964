"""The switch's choices, as functions of its models' state and one memory model (so that they are tested without
engines): which model a switch serves next, what must make room for it, and when a request is answered 503 without
a switch.

Which model: ``fair`` (the default) takes a model whose longest-waiting request has waited over ``starve_after_s``
first (the longest first), else the one with the most requests waiting (then the longest-waiting); ``fifo`` the
request that came first.

Room (``room_for``): GPU memory bounds the awake set (``memory.py``), and ``max_awake``, where set, caps it per GPU.
An engine stays awake, serving its own requests, while its memory is not needed. A wake that fits beside the awake
engines goes at once; one that does not parks idle engines first, the least recently used first; then it waits for
engines already leaving; then, where memory forces a choice between busy engines, a busy engine's turn ends once the
requests waiting for the model have waited, in sum, ``turn_s`` per request it has in flight (a starving request ends
it at once): it leaves (takes no new request, parks once its requests end) and the model wakes after it. Nothing is
parked or left for a wake that must wait anyway.

Start-up's preloads (``next_preload``, over ``Preloading``, a snapshot the preloads' loop takes after reading free
memory, so that nothing changes between the read and the decision): the next in the queue (one a start waits for,
one a request waits for, then start-up order) begins when a job is free and its GPUs' free memory holds its peak
beside the peaks of those running and what the starts going on, or the one the scheduler takes next, need
(``start_to_reserve_for``). ``preloads.py`` runs them.

Start-up's starts (``startup_batch``): one at a time where a start profiles the GPU's memory (``GpuNeed.profiles``);
where none does (vLLM with ``--kv-cache-memory-bytes``), up to ``start_jobs`` models whose preloads are done start
together, as many as fit the GPU's memory all resident at once (an 8B vLLM start is ~20 s, most of it imports,
torch.compile's cache and CUDA graphs: ten one after another are over three minutes). A model whose preload ends
while they start joins them (``joining``), on the same terms, once the front's first engine is up (the first start
compiles), unless requests wait for a model that has started: the switches they need go first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .config import SwitchConfig
from .gpus import GpuMemory
from .memory import GpuNeed, Holder, over_mib
from .model import Model
from .states import FailureKind, ModelState

S = ModelState


@dataclass(frozen=True)
class Room:
    """What a switch to a model does first: park ``park`` (idle), take ``leave`` (busy, their turn over) out of
    service; ``wait``: the model wakes only once the leaving engines have parked (or, with nothing to leave, a busy
    engine's turn ends in ``look_in_s``)."""

    park: tuple[Model, ...] = ()
    leave: tuple[Model, ...] = ()
    wait: bool = False
    look_in_s: float | None = None

    @property
    def now(self) -> bool:
        """Nothing to park, leave or wait for: the model wakes beside the others."""
        return not (self.park or self.leave or self.wait)


def wanted(models: Iterable[Model], config: SwitchConfig) -> list[Model]:
    """Models requests wait for that a switch may serve, the next first (by the schedule)."""
    now = time.monotonic()
    found = [m for m in models if m.waiting > m.reserved and m.state not in (S.AWAKE, S.LEAVING) and not refusal(m)]
    if config.schedule == "fifo":
        return sorted(found, key=lambda m: -m.waited_s(now))
    return sorted(found, key=lambda m: (m.waited_s(now) <= config.starve_after_s,
                                        -(m.waited_s(now) if m.waited_s(now) > config.starve_after_s else 0),
                                        -(m.waiting - m.reserved), -m.waited_s(now)))


def next_model(models: Iterable[Model], config: SwitchConfig, default: Model) -> Model | None:
    """The model to start or switch to next: one requests wait for (by the schedule), else the next one start-up
    has not reached (``startup_order``), else one whose start failed and may be tried again, else None."""
    models = list(models)
    first = wanted(models, config)
    if first:
        return first[0]
    return startup_next(models, default)


def startup_next(models: Sequence[Model], default: Model) -> Model | None:
    """The next model start-up has not reached (an eager one: a cached or lazy one starts for its first request),
    else one whose start failed and may be tried again, else None."""
    left = [m for m in startup_order(models, default) if not m.started and m.config.start == "eager"]
    left = left or retried(list(models))
    return left[0] if left else None


def startup_order(models: Iterable[Model], default: Model) -> list[Model]:
    """The order start-up takes the models in: the default, then those whose parked weights go to host memory
    (``parked_weights = "host"``), then the rest, each group as configured. A host-tier engine's weights leave the
    GPU once it has started and parked, so its preload (which holds them on the GPU, twice at its peak) finds more
    room early than late, when every GPU-tier model's weights are there: ten 8B vLLM models, six of them on the GPU
    tier, fit an H200 in this order and not in the configured one (the seventh preload would need 34 GiB where
    30 are free)."""
    rest = [m for m in models if m is not default]
    return [default, *sorted(rest, key=lambda m: m.config.parked_weights != "host")]


def retried(models: list[Model]) -> list[Model]:
    """Models whose start failed and whose back-off is over (or whose files changed): start-up tries them again by
    itself, no request needed (a default that failed once would otherwise leave ``/health`` at 503 until a request
    came, and a health-gated deployment sends none)."""
    return [m for m in models if m.state is ModelState.FAILED and m.failure is not None
            and m.failure.kind is FailureKind.START and not m.waiting and not refusal(m)]


def pick_victim(candidates: list[Model], schedule: str) -> Model:
    """The awake engine to park for another where its own wake says the GPU has too little (the memory model's
    estimate was short)."""
    if schedule == "fifo":
        return min(candidates, key=lambda x: x.last_used)
    return min(candidates, key=lambda x: (x.inflight > 0, x.last_used))


def holder(m: Model, state: ModelState | None = None) -> Holder:
    """``m`` as the memory model sees it (in ``state``, else its own; a model start-up has not reached holds no
    engine)."""
    state = state or (m.state if m.started else S.STOPPED)
    return Holder(m.engine.gpu_need(), state, m.config.parked_weights == "gpu" or not m.engine.parks)


def fits(m: Model, models: Sequence[Model], totals: dict[int, int], config: SwitchConfig,
         gone: Sequence[Model] = ()) -> bool:
    """Whether ``m`` awake fits beside the others, those in ``gone`` parked: ``max_awake`` (where set) and each of
    its GPUs' memory."""
    beside = [x for x in models if x is not m and x.config.shares_a_gpu(m.config)]
    if config.awake_cap and sum(x.state in (S.AWAKE, S.LEAVING) and x not in gone for x in beside) >= config.awake_cap:
        return False
    holders = [holder(m, S.AWAKE), *(holder(x, S.PARKED if x in gone else None) for x in models if x is not m)]
    return all(over_mib(g, totals[g], holders) <= 0 for g in m.engine.gpu_need().gpus if g in totals)


def turn_left_s(busy: Model, m: Model, config: SwitchConfig, now: float) -> float:
    """Seconds until ``busy``'s turn ends for ``m``: once ``m``'s waiting requests have waited, in sum, ``turn_s`` per
    request in flight on ``busy`` (0 at once where one of them starves)."""
    if not m.arrivals:
        return config.turn_s
    if now - min(m.arrivals) > config.starve_after_s:
        return 0.0
    owed = config.turn_s * max(1, busy.inflight) - sum(now - a for a in m.arrivals)
    return max(0.0, owed / len(m.arrivals))


def room_for(m: Model, models: Sequence[Model], totals: dict[int, int], config: SwitchConfig,
             now: float | None = None) -> Room:
    """What must make room for ``m`` to wake (``totals``: each GPU's MiB): see the module's docstring."""
    now = time.monotonic() if now is None else now
    if fits(m, models, totals, config):
        return Room()
    beside = [x for x in models if x is not m and x.config.shares_a_gpu(m.config)]
    movable = [x for x in beside if x.state is S.AWAKE and not x.config.keep_awake]
    idle = sorted((x for x in movable if not x.inflight), key=lambda x: x.last_used)
    for i in range(1, len(idle) + 1):
        if fits(m, models, totals, config, idle[:i]):
            return Room(park=tuple(idle[:i]))
    gone = [*idle, *(x for x in beside if x.state is S.LEAVING)]
    if len(gone) > len(idle) and fits(m, models, totals, config, gone):
        return Room(wait=True)  # the leaving engines will do; the idle ones park then if still needed
    busy = sorted((x for x in movable if x.inflight), key=lambda x: (turn_left_s(x, m, config, now), x.last_used))
    over = [x for x in busy if turn_left_s(x, m, config, now) <= 0]
    for i in range(1, len(over) + 1):
        if fits(m, models, totals, config, [*gone, *over[:i]]):
            return Room(leave=tuple(over[:i]), wait=True)
    if busy and fits(m, models, totals, config, [*gone, *busy]):  # once more turns end
        return Room(wait=True, look_in_s=min(turn_left_s(x, m, config, now) for x in busy if x not in over))
    return Room(park=tuple(idle))  # it does not fit even alone, by the estimate: its own wake says whether it does


def refusal(m: Model) -> str:
    """Why a request for ``m`` is answered 503 now without a switch ("" when a switch may serve it): its start
    failed, the back-off has not passed and its checkpoint's files are as they were."""
    f = m.failure
    if m.state is not ModelState.FAILED or f is None or f.kind is not FailureKind.START:
        return ""
    left = f.retry_at - time.monotonic()
    if left <= 0 or m.engine.files() != f.files:
        return ""
    return f"{f.message} (tried again in {left:.0f} s, or at once when its checkpoint's files change)"


@dataclass(frozen=True)
class Preloading:
    """Start-up's preloads at one moment, as ``next_preload`` reads them."""

    jobs: int  # at most this many at once
    running: Mapping[str, GpuNeed] = field(default_factory=dict)  # begun and not ended, with their needs
    done: frozenset[str] = frozenset()  # ended, their outcome kept
    wanted: tuple[str, ...] = ()  # a start waits for these
    starting: tuple[GpuNeed, ...] = ()  # engines starting: no preload begins on their GPUs
    failed_beside: frozenset[str] = frozenset()  # failed beside others: tried again with none running
    copying: frozenset[str] = frozenset()  # preloaded, their host copy being made (no GPU memory of a preload's)
    compiling: Mapping[str, GpuNeed] = field(default_factory=dict)  # compiles ahead of a start, by its model


def startup_batch(first: Model, models: Sequence[Model], totals: Mapping[int, int], jobs: int,
                  preloaded: Callable[[Model], bool], preloading: Mapping[int, int]) -> list[Model]:
    """The models start-up starts together with ``first`` (itself first): where no start among them profiles the
    GPU's memory, the next eager models start-up has not reached whose preloads are done (``preloaded``), in
    start-up order (``models``' order), up to ``jobs`` in all, each only where every GPU of its holds it and all
    those before it resident (``memory.over_mib``) beside the others as they are and the peaks of the preloads
    running (``preloading``: MiB per GPU). Just ``first`` otherwise."""
    if first.started or first.engine.gpu_need().profiles:
        return [first]
    return [first, *joining([first], models, totals, jobs, preloaded, preloading)]


def joining(starting: Sequence[Model], models: Sequence[Model], totals: Mapping[int, int], jobs: int,
            preloaded: Callable[[Model], bool], preloading: Mapping[int, int]) -> list[Model]:
    """The models whose starts join ``starting`` (start-up's starts going on, or about to): as ``startup_batch``
    says, up to ``jobs`` starts in all; none where one of ``starting`` profiles the GPU's memory, until its profile
    is done (``Engine.profiled``)."""
    if any(x.engine.gpu_need().profiles and not x.engine.profiled() for x in starting):
        return []
    batch = list(starting)
    for m in models:
        if len(batch) >= jobs:
            break
        need = m.engine.gpu_need()
        if (m in batch or m.started or m.config.start != "eager" or m.state is not S.STARTING or need.profiles
                or not need.gpus or not preloaded(m)):
            continue
        holders = [holder(x, S.STARTING if x in batch or x is m else None) for x in models]
        if all(over_mib(g, totals[g], holders) + preloading.get(g, 0) <= 0 for g in need.gpus if g in totals):
            batch.append(m)
    return batch[len(starting):]


def queued_preloads(models: Sequence[Model], p: Preloading) -> list[Model]:
    """Models whose preload has not begun, the next first: one a start waits for, one a request waits for, then
    start-up order (``models``' order)."""
    left = [m for m in models if m.name not in p.running and m.name not in p.done and m.name not in p.copying]
    return sorted(left, key=lambda m: (m.name not in p.wanted, not m.waiting, models.index(m)))


def next_preload(models: Sequence[Model], p: Preloading, need: Callable[[Model], GpuNeed],
                 memory: Mapping[int, GpuMemory], reserve_for: Sequence[Model]) -> Model | None:
    """The preload to begin now: the head of the queue where a job is free and it is admitted, else None.

    Not on GPUs where an engine that profiles is starting (vLLM sizes its KV cache from a profile of the whole GPU),
    nor where a model whose preload is done and whose start profiles has yet to start (its start, seconds, goes
    before a preload, minutes, which would hold it back; not while that start waits for its compile ahead, which
    takes longer), unless a start waits for it. Beside the preload of the front's first start too: on an H200
    (cold caches) the default's took 48.8 s alone and 49.1 s beside three others, which were done by then. Where
    none runs, it begins
    when it fits or a start waits for it (vLLM's own check decides then); beside others, only when it fits
    (``preload_fits``); one that failed beside others, only alone."""
    queued = queued_preloads(models, p)
    if not queued or len(p.running) >= p.jobs:
        return None
    m, own = queued[0], need(queued[0])
    if (m.name in p.failed_beside and p.running) or any(set(o.gpus) & set(own.gpus) for o in p.starting):
        return None
    preloaded = (p.done | p.copying) - set(p.compiling)  # a host copy after a preload, or the compile ahead of its
    # start, holds that start back, not the rule
    if m.name not in p.wanted and any(not x.started and x.config.start == "eager" and x.name in preloaded
                                      and need(x).profiles and set(need(x).gpus) & set(own.gpus) for x in models):
        return None
    fits = all(preload_fits(m, own, g, memory[g], p, need, reserve_for) for g in own.gpus if g in memory)
    return m if fits or (not p.running and m.name in p.wanted) else None


def preload_fits(m: Model, own: GpuNeed, gpu: int, mem: GpuMemory, p: Preloading, need: Callable[[Model], GpuNeed],
                 reserve_for: Sequence[Model]) -> bool:
    """Free memory on ``gpu`` holds ``m``'s preload at its peak beside the peaks of those running and of the compiles
    ahead (``GpuNeed.ahead_mib``; each counted whole, even once it has taken part of it: conservative), and what the
    starts of ``reserve_for`` need there (each counted whole, even once it has taken part of it; they wait for no
    preload, nor for the weights those leave in the keeper)."""
    held = (sum(n.preload_mib(mem.total_mib) for n in p.running.values() if gpu in n.gpus)
            + sum(n.ahead_mib for n in p.compiling.values() if gpu in n.gpus))
    reserve = sum(need(x).start_mib(mem.total_mib) for x in reserve_for
                  if x is not m and x.name not in p.running and gpu in need(x).gpus)
    return mem.free_mib - held - reserve >= own.preload_mib(mem.total_mib)


def start_to_reserve_for(models: Sequence[Model], config: SwitchConfig, default: Model) -> tuple[Model, ...]:
    """The starts a preload leaves room for: those in progress, else the one the scheduler takes next."""
    starting = tuple(x for x in models if x.started and x.state is S.STARTING)
    if starting:
        return starting
    following = next_model(models, config, default)
    return (following,) if following is not None else ()
