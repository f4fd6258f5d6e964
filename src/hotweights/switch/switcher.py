"""Which engines are awake: the scheduler. Requests wait for their model (``admission.py``); one loop (``run``) starts,
parks and wakes engines, one move at a time (start-up's starts several together where none profiles the GPU's
memory: ``schedule.startup_batch``), as ``schedule.py`` decides over the memory model (``memory.py``), through the
lifecycle (``lifecycle.py``). The switcher holds the other two: ``requests`` and ``life``.

An engine stays awake while its GPU memory is not needed. To wake a model, the scheduler asks ``schedule.room_for``
what must make room: nothing (it wakes beside the awake engines), idle engines (they park, the least recently used
first), or busy ones whose turn is over (they leave: no new request, parked once their requests in flight end; a
switch never cuts a stream), the model waking once they have. While a wake must wait, another model that fits with
nothing moved may still wake. Then the model wakes (or starts again, if its engine died or cannot park) and every
request waiting for it goes through at once: a switch serves the whole batch that waited for it. A wake refused for
memory (``WakeRefused``: the estimate was short) parks one more engine on its GPUs and tries again. Start-up starts
every engine in turn (or several at once, as above), the default first and awake, the others parked; a request for
a model start-up has not reached moves it to the front, and keeps it awake. States and failures: ``states.py``. A
request that waits longer than ``request_timeout_s`` is answered 503, and never by another model's engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .actions import idle_timeouts
from .admission import Admission
from .config import ModelConfig, SwitchConfig
from .engines import EngineError, EngineLike
from .lifecycle import Lifecycle
from .metrics import SwitchMetrics
from .model import Model
from .schedule import Room, joining, retried, startup_batch, startup_next, startup_order, wanted
from .states import SERVING, Failure, FailureKind, ModelState

S = ModelState
logger = logging.getLogger("hotweights.switch")
JOIN_LOOK_S = 0.25  # while start-up's starts go on, whether a model whose preload ended may join them: this often


class Switcher:
    def __init__(self, config: SwitchConfig, metrics: SwitchMetrics, engines: Callable[[ModelConfig], EngineLike],
                 totals: dict[int, int] | None = None) -> None:
        self.config = config
        self.life = Lifecycle(config, metrics, engines, totals)
        self.models = self.life.models
        self.requests = Admission(config, self.models, self.life.changes, metrics)
        self._said_compiled = False  # whether ``_compiled_by`` has said the first start compiled
        self._learned_kv: set[str] = set()  # starts whose profile ``_joining`` has pinned others' KV caches to

    async def run(self) -> None:
        """Start-up, then every switch, one at a time, in the order ``next_model`` gives; with ``preload_jobs`` > 1
        start-up's preloads run ahead of the starts, that many at once where memory allows, and with ``start_jobs``
        > 1 up to that many starts go together where none profiles the GPU's memory (``schedule.startup_batch``)."""
        preloading = self.life.begin_preloads(self.config.preload_jobs)
        try:
            await self._schedule()
        finally:
            if preloading is not None:
                preloading.cancel()

    async def _schedule(self) -> None:
        life, kick = self.life, self.life.changes.kick
        while True:
            async with life.busy:
                m, room, look = self._plan()
                if m is not None:
                    together = self._startup_batch(m)
                    if len(together) > 1:
                        logger.info("switch: starting %s together (no start profiles the GPU's memory)",
                                    ", ".join(x.name for x in together))
                    await self._starts(together, room)
            if m is None:
                try:
                    await asyncio.wait_for(kick.wait(), look)
                except TimeoutError:
                    pass
                kick.clear()

    async def _go(self, m: Model, room: Room) -> None:
        """Start ``m`` (or start it again), or switch to it making ``room``; start-up is ready once the default is
        (or every model has started)."""
        life = self.life
        try:
            await (life.start_up(m) if not m.started or m in retried([m]) else life.switch_to(m, room))
        except Exception as exc:  # never the end of the scheduler, a bug included: its requests get 503
            logger.exception("switch: %s: %s", m.name, exc)
            m.attempts_failed += 1
            m.failure = Failure(FailureKind.WAKE, f"the switch to it failed: {exc}")
            life.changes.changed()
            await asyncio.sleep(0.1)  # a bug that repeats must not spin the loop
        if m.config is self.config.default or all(x.started and x.state is not S.STARTING
                                                  for x in self.models.values()):
            life.ready.set()

    async def _starts(self, together: list[Model], room: Room) -> None:
        """Start (or switch to) ``together``; a start-up's starts are joined by models whose preloads end meanwhile
        (``schedule.joining``): on an H200 the second of ten 8B had its preload done 58 s before the first's cold
        start ended, and waited for it."""
        tasks = {asyncio.create_task(self._go(x, room)): x for x in together}
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks, timeout=JOIN_LOOK_S, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del tasks[task]
                for x in self._joining(list(tasks.values())):
                    logger.info("switch: %s starts beside %s (its preload done; no start profiles the GPU's memory)",
                                x.name, ", ".join(y.name for y in tasks.values()))
                    tasks[asyncio.create_task(self._go(x, Room()))] = x
        finally:  # the front stops: as gather did, what goes on is cancelled with it
            for task in tasks:
                task.cancel()

    def _joining(self, starting: list[Model]) -> list[Model]:
        """The models whose starts join ``starting`` now (``schedule.joining``): none where those are not start-up's
        starts, before the front's first engine is up unless its code was compiled ahead or the first start has
        compiled it by now (the first start of an architecture compiles it, 74.9 s for an 8B on an H200 against
        16-37 s for the starts after it, which load the compiled code: one beside it before that would compile too;
        every start waits for a compile ahead still running), or while requests wait for a model that has started
        (the switch they need goes first). A start that profiles the GPU's memory is joined once its profile is done,
        by models that take the KV cache it gave (``Lifecycle.pin_kv_as``)."""
        life = self.life
        if (not starting or any(x.state is not S.STARTING for x in starting) or self.config.start_jobs <= 1
                or life.preloads is None
                or (not any(x.state in SERVING for x in self.models.values()) and life.preloads.first_start_compiles()
                    and not self._compiled_by(starting))
                or any(x.started and x not in starting for x in wanted(self.models.values(), self.config))):
            return []
        for x in starting:  # its profile done: the models that would profile as it does take its KV cache
            if x.name not in self._learned_kv and x.engine.gpu_need().profiles and x.engine.profiled():
                self._learned_kv.add(x.name)
                life.pin_kv_as(x)
        order = startup_order(list(self.models.values()), self.models[self.config.default.name])
        return joining(starting, order, life.totals, self.config.start_jobs, life.preloads.preloaded,
                       life.preloads.peaks_mib(life.totals))

    def _compiled_by(self, starting: list[Model]) -> bool:
        """Whether the front's first start (one of ``starting``) has compiled its engine's code (``Engine.compiled``):
        said once, as starts may join it from now on (those that join find the compiled code: not said again)."""
        done = next((x for x in starting if x.engine.compiled()), None)
        if done is not None and not self._said_compiled:
            self._said_compiled = True
            logger.info("switch: %s's start has compiled its engine's code (its log says so): the starts whose "
                        "preloads are done may join it now", done.name)
        return done is not None

    def _startup_batch(self, m: Model) -> list[Model]:
        """``m`` and the models start-up starts beside it (``schedule.startup_batch``): only ``m`` unless it is a
        start-up's start."""
        life = self.life
        if m.started or self.config.start_jobs <= 1 or life.preloads is None:  # no preloads ahead: each start
            return [m]                                                          # preloads its own model
        order = startup_order(list(self.models.values()), self.models[self.config.default.name])
        return startup_batch(m, order, life.totals, self.config.start_jobs, life.preloads.preloaded,
                             life.preloads.peaks_mib(life.totals))

    def _plan(self) -> tuple[Model | None, Room, float | None]:
        """The model to start or wake now and what makes room for it; (None, _, seconds until a busy engine's turn
        ends, or None) when none can go now. The first model requests wait for may make busy engines leave; one
        after it goes only where it fits with nothing moved (it takes no memory the first one waits for)."""
        models = list(self.models.values())
        look: float | None = None
        order = wanted(models, self.config)
        for i, m in enumerate(order):
            if not m.started or m in retried([m]):
                if i == 0:
                    return m, Room(), None
                continue
            room = self.life.room(m)
            if i == 0:
                for victim in room.leave:
                    self.life.leave(victim, f"for {m.name}", f", {m.waiting} wait for {m.name}")
            if not room.wait and (i == 0 or room.now):
                return m, room, None
            if room.look_in_s is not None:
                look = room.look_in_s if look is None else min(look, room.look_in_s)
        if order:
            return None, Room(), look
        return startup_next(models, self.models[self.config.default.name]), Room(), None

    async def watch(self, interval_s: float = 0.5) -> None:
        """Engines that died are marked failed (their next request starts them again); parked embedded engines
        idle past ``deep_park_after_s`` deepen to level 2; a model's idle timeouts park or stop it
        (``actions.idle_timeouts``)."""
        while True:
            await asyncio.sleep(interval_s)
            for m in self.models.values():
                if self.life.busy.locked():
                    break
                if m.state in SERVING and not m.engine.alive():
                    self.life.exited(m)
                elif (m.state is S.PARKED and m.config.deep_park_after_s and m.kind.deepens_when_idle
                      and time.monotonic() - m.parked_at > m.config.deep_park_after_s):
                    async with self.life.busy:
                        try:
                            await self.life.park(m, 2)
                        except EngineError as exc:
                            logger.warning("switch: %s", exc)
                elif m.config.park_after_s or m.config.stop_after_s:
                    try:
                        await idle_timeouts(self.life, m)
                    except EngineError as exc:
                        logger.warning("switch: %s", exc)
