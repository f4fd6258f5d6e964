"""A model behind the switch as the switcher keeps it (``Model``), and as ``/switch/status`` and ``hotweights switch
status`` show it (``ModelRow``, frozen). Torch-free."""

from __future__ import annotations

import asyncio
import dataclasses
import contextlib
import statistics
import time
import weakref
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from .config import ModelConfig, ParkedWeights
from .upstream.engines import EngineLike
from .gpus import host_mib
from .kinds import KINDS, EngineKind
from .preempt import Resumable
from .snapshot import View
from .states import Failure, FailureKind, ModelState, PreloadOutcome, PreloadState, StartState

T = TypeVar("T")


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


class Changes:
    """Who looks again when a model changes: the scheduler (``kick``), start-up's jobs and the requests waiting for a
    model (``wait``, ``next``)."""

    def __init__(self) -> None:
        self.kick = asyncio.Event()  # a request waits, or an engine changed: the scheduler looks again
        self._moved = asyncio.Event()  # set (and replaced) on every change: those waiting look again

        self.died: set[str] = set()  # models whose engine was found dead outside the scheduler: it moves them

    def changed(self) -> None:
        self.kick.set()
        self._moved.set()
        self._moved = asyncio.Event()

    def engine_gone(self, name: str) -> None:
        """``name``'s engine was found dead (by a request, or the watch): the scheduler marks it failed, under its
        lock."""
        self.died.add(name)
        self.kick.set()

    async def wait(self) -> None:
        """Until the next change."""
        await self._moved.wait()

    async def next(self, timeout_s: float) -> None:
        """Until the next change, or ``timeout_s``; the scheduler is asked to look first."""
        moved = self._moved
        self.kick.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(moved.wait(), timeout_s)


@dataclass
class Ledger:
    """The requests of one model, kept by the switcher's request side and its switches only through these methods:
    waiting for it (each one's ``time.monotonic()`` of arrival), let in by a switch and not yet taken up
    (``reserved``: counted in flight already, so that the next switch cannot take the engine from under them), in
    flight on its engine. Its invariants hold after each method: ``0 <= reserved <= waiting``, ``reserved <=
    inflight``, and ``idle`` is set exactly when nothing is in flight."""

    arrivals: list[float] = field(default_factory=list)
    refused: dict[float, str] = field(default_factory=dict)  # waiting requests a failed switch answers, by arrival
    due: dict[float, float] = field(default_factory=dict)  # by arrival: when a held stream's next token is due
    came: deque[float] = field(default_factory=lambda: deque(maxlen=1 << 16))  # every arrival lately (its demand)
    reserved: int = 0
    inflight: int = 0
    last_used: float = 0.0  # time.time() of the last request let in or done
    idle: asyncio.Event = field(default_factory=_set_event)

    @property
    def waiting(self) -> int:
        return len(self.arrivals)

    def arrive(self, due: float | None = None) -> float:
        """A request comes for the model: its arrival. ``due``: when its next token is due (a held stream's; else
        its first token's, which the schedule counts from its arrival)."""
        at = time.monotonic()
        self.arrivals.append(at)
        self.came.append(at)
        if due is not None:
            self.due[at] = due
        return at

    def demand(self, now: float, window_s: float) -> float:
        """Its requests a second over the last ``window_s`` seconds (tiers from traffic: ``tiers.py``)."""
        while self.came and self.came[0] < now - window_s:
            self.came.popleft()
        return len(self.came) / window_s

    def let_in(self) -> int:
        """A switch woke the model: every request waiting that no switch let in yet is counted in flight now. The
        batch."""
        batch = self.waiting - self.reserved
        self.reserved += batch
        self._busy(batch)
        self.last_used = time.time()
        return self._checked(batch)

    def refuse(self, reason: str) -> int:
        """The switch the waiting requests waited for failed: each is answered ``reason`` (``refusal``) unless a
        switch before let it in (its place is taken first). How many waited."""
        for at in self.arrivals:
            self.refused[at] = reason or "the switch it waited for failed"
        return self._checked(len(self.arrivals))

    def refusal(self, arrived: float) -> str:
        """Why the request that arrived at ``arrived`` is refused ("" where it is not)."""
        return self.refused.pop(arrived, "")

    def enter(self, awake: bool) -> bool:
        """A waiting request takes the engine: its place in a let-in batch, else a place of its own where the engine
        is ``awake``; False when it must wait on."""
        if self.reserved:
            self.reserved -= 1
        elif awake:
            self._busy(1)
        else:
            return False
        return self._checked(True)

    def gone(self, arrived: float, served: bool) -> bool:
        """The request that arrived at ``arrived`` waits no more: ``served`` (it entered), or it gave up (a timeout,
        its client gone, a failed switch), when a place a switch kept for it is given back. Whether giving it back
        left the engine idle."""
        self.arrivals.remove(arrived)
        self.refused.pop(arrived, None)
        self.due.pop(arrived, None)
        if served:
            self.last_used = time.time()
        elif self.reserved > self.waiting:  # the batch had a place for it: given back, as if it had been served
            self.reserved -= 1
            return self.leave()
        return self._checked(False)

    def leave(self) -> bool:
        """A request in flight ends. Whether the engine is idle now."""
        self.inflight -= 1
        self.last_used = time.time()
        if not self.inflight:
            self.idle.set()
        return self._checked(not self.inflight)

    def _busy(self, n: int) -> None:
        self.inflight += n
        if self.inflight:
            self.idle.clear()

    def _checked(self, result: T) -> T:
        assert 0 <= self.reserved <= self.waiting and self.reserved <= self.inflight, self
        assert self.idle.is_set() == (not self.inflight), self
        return result


def lately(before: float | None, seconds: float) -> float:
    """What a wake (or a park) takes lately: an average that weighs the last one by half (the first alone)."""
    return seconds if before is None else (before + seconds) / 2


@dataclass
class Model:
    config: ModelConfig
    engine: EngineLike
    state: ModelState = ModelState.STARTING
    start_phase: StartState = StartState.WAITING  # how far its start has gone (start-up's table: states.py)
    preload: PreloadState = PreloadState.QUEUED  # how far its preload has gone
    awaited: bool = False  # its start waits for its preload
    preloaded: tuple[PreloadOutcome, float] | None = None  # its preload's outcome and seconds, once done
    ledger: Ledger = field(default_factory=Ledger)  # its requests: waiting, let in, in flight
    parked_at: float = 0.0
    wakes: int = 0
    start_failures: int = 0  # starts that failed in a row: the back-off doubles with each
    crashes: int = 0  # its engine's deaths in a row, each within ``failures.STABLE_S`` of its start
    up_since: float = 0.0  # time.monotonic() its engine last came up
    awake_at: float = 0.0  # time.monotonic() it last became awake (a wake or a start)
    wake_s: float | None = None  # what its wakes took, lately (``lately``)
    park_s: float | None = None  # what its parks took, lately (``lately``)
    keep_alive_s: float | None = None  # a request's keep_alive (Ollama's), in place of park_after_s; inf: never
    failure: Failure | None = None  # why it is FAILED (set and cleared by ``Lifecycle.move`` only)
    last_error: str = ""  # why its last wake failed, where it stayed where it was; cleared once it is awake
    streams: set[Resumable] = field(default_factory=set)  # its streams in flight that may be paused (preempt.py)
    entering: weakref.WeakSet[Resumable] = field(default_factory=weakref.WeakSet)  # such streams let in and on their
    # way to its engine, not in ``streams`` until its answer begins (``View.coming``); one that never joins (an error
    # answer) is gone with its request
    kv_held: bool = False  # it parks (or is parked) holding streams with their KV caches (``Lifecycle.leave``)
    left_for: str = ""  # the model it last left for, until that one is awake (``schedule.wanted``)
    tier: ParkedWeights | None = None  # its parked weights' place as traffic moved them (``tiers.py``)
    _placed: tuple[ModelConfig, ModelConfig] | None = field(default=None, repr=False)
    answered: deque[tuple[float, float | None]] = field(default_factory=lambda: deque(maxlen=1024))
    # (time.time(), its first byte's seconds from arrival or None) of each request relayed: the rate and TTFT shown

    def relayed(self, first_byte_s: float | None) -> None:
        self.answered.append((time.time(), first_byte_s))

    def pace(self, window_s: float = 60.0) -> tuple[int, float | None]:
        """Requests relayed in the last ``window_s`` seconds, and the median of their times to first byte."""
        since = time.time() - window_s
        recent = [first for at, first in self.answered if at >= since]
        firsts = [f for f in recent if f is not None]
        return len(recent), (statistics.median(firsts) if firsts else None)

    @property
    def name(self) -> str:
        return self.config.name

    def park_after_s(self) -> float | None:
        """How long it stays awake once idle before it parks: a request's ``keep_alive`` where one was given (0:
        at once; ``inf``: never), else its ``park_after_s`` (0: never); None: never."""
        if self.keep_alive_s is not None:
            return None if self.keep_alive_s == float("inf") else self.keep_alive_s
        return self.config.park_after_s or None

    @property
    def cached(self) -> str:
        """Its preload's account (``PreloadOutcome``: "cached", or "not cached (why)": its engine reads its
        checkpoint), "" before its preload is done."""
        return str(self.preloaded[0]) if self.preloaded else ""

    @property
    def started(self) -> bool:
        """Start-up (or a request) has reached it: its engine was started once, or is starting."""
        return self.start_phase is not StartState.WAITING

    @property
    def kind(self) -> EngineKind:
        return KINDS[self.config.engine]

    # the ledger's counts, read where the switch decides (writes go through ``ledger``)
    @property
    def waiting(self) -> int:
        return self.ledger.waiting

    @property
    def inflight(self) -> int:
        return self.ledger.inflight

    @property
    def reserved(self) -> int:
        return self.ledger.reserved

    @property
    def arrivals(self) -> list[float]:
        return self.ledger.arrivals

    @property
    def idle(self) -> asyncio.Event:
        return self.ledger.idle

    @property
    def last_used(self) -> float:
        return self.ledger.last_used

    @last_used.setter
    def last_used(self, at: float) -> None:  # an operator's start, or start-up's first count of idle time
        self.ledger.last_used = at

    @property
    def error(self) -> str:
        """Why it failed, else why its last wake did, in one line ("" where neither)."""
        return self.failure.message if self.failure is not None else self.last_error

    def waited_s(self, now: float | None = None) -> float:
        """How long its longest-waiting request has waited."""
        return (now or time.monotonic()) - min(self.arrivals) if self.arrivals else 0.0

    def view(self) -> View:
        """It now, as the scheduler decides over it (``snapshot.View``). Its checkpoint's files are scanned only
        where its start failed (they decide when it is tried again)."""
        f = self.failure
        failed_start = self.state is ModelState.FAILED and f is not None and f.kind is FailureKind.START
        return View(self.placed, self.state, self.engine.gpu_need(), self.start_phase, self.engine.parks,
                    self.waiting, self.reserved, self.inflight, self.last_used, tuple(self.arrivals), f,
                    files_changed=failed_start and f is not None and self.engine.files() != f.files,
                    preload=self.preload, awaited=self.awaited,
                    dues=tuple(self.ledger.due.get(a) for a in self.arrivals), awake_at=self.awake_at,
                    wake_s=self.wake_s, park_s=self.park_s, kv_held=self.kv_held, can_hold=self.can_hold,
                    deepens=self.kind.deepens_when_idle, left_for=self.left_for, kv_host=self.engine.kv_to_host,
                    clocks=tuple((r.arrived, r.first_at, len(r.ids)) for r in self.streams if r.may_pause),
                    coming=self.coming())

    def coming(self) -> tuple[float, ...]:
        """When each request came that is in flight on its way to its engine (``View.coming``): those let in at its
        wake not yet taken up (awake, its waiting requests are those; a held stream's, with its due, joins at once),
        and the streams that took their place and wait for the engine's answer to begin."""
        let_in = self.ledger.arrivals if self.state is ModelState.AWAKE else ()
        return (*(a for a in let_in if a not in self.ledger.due), *(r.arrived for r in self.entering))

    @property
    def placed(self) -> ModelConfig:
        """Its config with its parked weights where traffic put them (``tier``), as the scheduler sees it."""
        if self.tier is None or self.tier == self.config.parked_weights:
            return self.config
        if self._placed is None or self._placed[0] is not self.config:
            self._placed = (self.config, dataclasses.replace(self.config, parked_weights=self.tier))
        return self._placed[1]

    @property
    def can_hold(self) -> bool:
        """Whether a park now would hold streams with their KV caches: its engine's park keeps them, and it serves a
        stream that may be paused."""
        return self.engine.keeps_kv and any(r.may_pause for r in self.streams)

    def row(self, gpu: dict[int, int]) -> ModelRow:
        """Its status row: the pids of an engine that runs (0 for one that died or stopped), its last request
        relayed as its last use (None where it never had one: start-up's count of idle time is not a use)."""
        alive = self.engine.alive()
        pids = self.engine.pids() if alive else []
        held = sum(gpu.get(p, 0) for p in pids) if gpu and pids else None
        requests, first = self.pace()
        pid = self.engine.pid if alive else 0
        return ModelRow(self.name, self.config.engine, self.state.value, pid, (self.engine.server or pid) if alive
                        else 0, held, list(self.config.gpus) or None, self.engine.port, self.inflight, self.waiting,
                        self.answered[-1][0] if self.answered else None, self.wakes, self.engine.parks,
                        self.error or None,
                        str(self.engine.log_path), host_mib(pids) if pids else None, self.placed.parked_weights,
                        self.config.start, list(self.config.aliases), requests, first, self.cached or None,
                        self.preloaded is not None and self.preloaded[0].failed)


@dataclass(frozen=True, slots=True)
class Switched:
    """A switch, for ``/switch/status`` and the status page: when (``time.time()``), how long from taking the lock to
    awake, where its weights came from, how long its first request had waited, which engines parked for it."""

    at: float
    model: str
    seconds: float
    source: str
    waited_s: float
    parked: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelRow:
    name: str
    engine: str
    state: str
    pid: int  # the engine's process (for vLLM: its launcher)
    server_pid: int  # the process that serves (a warm standby's child, else ``pid``)
    gpu_mib: int | None  # what its processes hold on the GPU (nvidia-smi), None where it cannot be read
    gpus: list[int] | None
    port: int
    inflight: int
    waiting: int
    last_used: float | None
    wakes: int
    parks: bool
    error: str | None  # one line
    log: str
    host_mib: int | None = None  # its processes' own resident host memory (not the keeper's pages they map)
    parked_weights: str = "gpu"  # where its weights stay while it is parked: "gpu" or "host"
    start: str = "eager"
    aliases: list[str] | None = None
    requests_1m: int = 0  # requests relayed to it in the last minute
    ttft_p50_s: float | None = None  # their median time to first byte, the wait for a switch included
    cached: str | None = None  # its last preload's account: "cached", or "not cached (why)" (served from disk)
    from_disk: bool = False  # its preload failed: the keeper could not take it, each start reads its checkpoint

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ModelRow:
        return cls(**{k: row.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]  # a status row
