"""Which of start-up's preloads begins, and when (``next_preload``), as a pure function of a snapshot's preload and
start states (``preloading``: their projection), free memory and the starts to leave room for: tested as a table,
run by ``startup.py``.

Start-up's preloads (``next_preload``, over ``Preloading``, the projection of a snapshot's preload and start states
that start-up takes right after reading free memory, so that nothing changes between the read and the decision): the
next in the queue (one a start waits for, one a request waits for, then start-up order) begins when a job is free
and its GPUs' free memory holds its peak beside the peaks of those running and what the starts going on, or the one
the scheduler takes next, need (``start_to_reserve_for``). ``startup.py`` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .config import SwitchConfig
from .gpus import GpuMemory
from .memory import GpuNeed
from .schedule import next_model, startup_order
from .snapshot import Snapshot, View
from .states import STARTS_GOING_ON, ModelState, PreloadState

S = ModelState


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


def preloading(s: Snapshot) -> Preloading:
    """Start-up's preloads in ``s``, as ``next_preload`` reads them (a projection of the views' states)."""
    P = PreloadState
    return Preloading(s.jobs, dict(s.running), frozenset(v.name for v in s.models if v.preload is P.DONE),
                      tuple(v.name for v in s.models if v.awaited and v.preload in (P.QUEUED, P.RETRY_ALONE)),
                      tuple(v.need for v in s.models if v.start in STARTS_GOING_ON and v.need.profiles),
                      frozenset(v.name for v in s.models if v.preload is P.RETRY_ALONE),
                      frozenset(v.name for v in s.models if v.preload is P.COPYING), dict(s.compiling))


def preload_queue(s: Snapshot) -> list[View]:
    """The models whose preloads start-up may begin, in start-up order: every one a start waits for, and where
    preloads run ahead of the starts, every model but a lazy one (it preloads for its first request)."""
    return [v for v in startup_order(s) if v.awaited or (s.preloads_ahead and v.config.start != "lazy")]


def queued_preloads(views: Sequence[View], p: Preloading) -> list[View]:
    """Models whose preload has not begun, the next first: one a start waits for, one a request waits for, then
    start-up order (``views``' order)."""
    left = [v for v in views if v.name not in p.running and v.name not in p.done and v.name not in p.copying]
    return sorted(left, key=lambda v: (v.name not in p.wanted, not v.waiting, views.index(v)))


def next_preload(views: Sequence[View], p: Preloading, memory: Mapping[int, GpuMemory],
                 reserve_for: Sequence[View]) -> View | None:
    """The preload to begin now: the head of the queue where a job is free and it is admitted, else None.

    Not on GPUs where an engine that profiles is starting (vLLM sizes its KV cache from a profile of the whole GPU),
    nor where a model whose preload is done and whose start profiles has yet to start (its start, seconds, goes
    before a preload, minutes, which would hold it back; not while that start waits for its compile ahead, which
    takes longer), unless a start waits for it. Beside the preload of the front's first start too: on an H200
    (cold caches) the default's took 48.8 s alone and 49.1 s beside three others, which were done by then. Where
    none runs, it begins when it fits or a start waits for it (vLLM's own check decides then); beside others, only
    when it fits (``preload_fits``); one that failed beside others, only alone."""
    queued = queued_preloads(views, p)
    if not queued or len(p.running) >= p.jobs:
        return None
    v = queued[0]
    own = v.need
    if (v.name in p.failed_beside and p.running) or any(set(o.gpus) & set(own.gpus) for o in p.starting):
        return None
    preloaded = (p.done | p.copying) - set(p.compiling)  # a host copy after a preload, or the compile ahead of its
    # start, holds that start back, not the rule
    if v.name not in p.wanted and any(not x.started and x.config.start == "eager" and x.name in preloaded
                                      and x.need.profiles and set(x.need.gpus) & set(own.gpus) for x in views):
        return None
    fits = all(preload_fits(v, g, memory[g], p, reserve_for) for g in own.gpus if g in memory)
    return v if fits or (not p.running and v.name in p.wanted) else None


def preload_fits(v: View, gpu: int, mem: GpuMemory, p: Preloading, reserve_for: Sequence[View]) -> bool:
    """Free memory on ``gpu`` holds ``v``'s preload at its peak beside the peaks of those running and of the compiles
    ahead (``GpuNeed.ahead_mib``; each counted whole, even once it has taken part of it: conservative), and what the
    starts of ``reserve_for`` need there (each counted whole, even once it has taken part of it; they wait for no
    preload, nor for the weights those leave in the keeper)."""
    held = (sum(n.preload_mib(mem.total_mib) for n in p.running.values() if gpu in n.gpus)
            + sum(n.ahead_mib for n in p.compiling.values() if gpu in n.gpus))
    reserve = sum(x.need.start_mib(mem.total_mib) for x in reserve_for
                  if x.name != v.name and x.name not in p.running and gpu in x.need.gpus)
    return mem.free_mib - held - reserve >= v.need.preload_mib(mem.total_mib)


def start_to_reserve_for(s: Snapshot, config: SwitchConfig) -> tuple[View, ...]:
    """The starts a preload leaves room for: those in progress, else the one the scheduler takes next."""
    starting = tuple(v for v in s.models if v.started and v.state is S.STARTING)
    if starting:
        return starting
    following = next_model(s, config)
    return (following,) if following is not None else ()
