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
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from . import tiers
from ..errors import HotweightsError
from .actions import ACTIONS, Refused, act, idle_timeouts
from .admission import Admission
from .config import ConfigError, ModelConfig, SwitchConfig
from .running import Reload, diff
from .upstream.engines import EngineError, EngineLike
from .failures import gone
from .lifecycle import Lifecycle
from .metrics import SwitchMetrics
from .model import Model
from .schedule import Plan, Room, Start, Wait, Wake, joining, may_join, plan
from .states import SERVING, STARTS_GOING_ON, ModelState, PreloadState, StartState

S = ModelState
STARTING_UP = frozenset({StartState.PREPARING, *STARTS_GOING_ON})
PRELOADING = frozenset({PreloadState.RUNNING, PreloadState.COPYING})
logger = logging.getLogger("hotweights.switch")


def said_if_failed(task: asyncio.Task[Any]) -> None:
    """A task of the switch's that ended with an exception (a bug: the scheduler, start-up's jobs or the watch gone)
    logs it at once, not at the front's exit."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("switch: %s ended: %s", task.get_name(), exc, exc_info=exc)


class Switcher:
    def __init__(self, config: SwitchConfig, metrics: SwitchMetrics, engines: Callable[[ModelConfig], EngineLike],
                 totals: dict[int, int] | None = None) -> None:
        self.config = config
        self.life = Lifecycle(config, metrics, engines, totals)
        self.models = self.life.models
        self.requests = Admission(config, self.models, self.life.changes, metrics)

    # the port's door (``door.SwitchPort``)
    async def acquire(self, name: str, due: float | None = None) -> Model:
        return await self.requests.acquire(name, due)

    def release(self, m: Model) -> None:
        self.requests.release(m)

    async def act(self, name: str, what: str) -> str:
        action = next((a for a in ACTIONS if a == what), None)
        if action is None:
            raise Refused(f"no action {what!r}: one of {', '.join(ACTIONS)}")
        return await act(self.life, self.models[name], action)

    async def unload(self) -> dict[str, str]:
        return {name: await act(self.life, m, "stop") for name, m in list(self.models.items())}

    def health(self) -> tuple[bool, dict[str, Any]]:
        m = self.models[self.config.default.name]
        ok = self.life.ready.is_set() and m.state is not S.FAILED
        body: dict[str, Any] = {"status": "ok" if ok else "unavailable", "model": m.name, "state": m.state.value}
        if not ok:
            body["reason"] = m.error or ("start-up has not reached it yet" if not m.started
                                         else f"its engine is {m.state.value}")
            left = m.failure.retry_at - time.monotonic() if m.failure is not None else 0.0
            if left > 0:
                body["retry_in_s"] = round(left, 1)
        return ok, body

    def status(self, gpu: dict[int, int]) -> dict[str, Any]:
        return {"models": [m.row(gpu).to_json() for m in self.models.values()],
                "switches": [dataclasses.asdict(s) for s in reversed(self.life.switched)]}

    def keep_alive(self, name: str, seconds: float) -> None:
        m = self.models[name]
        if m.keep_alive_s != seconds:
            logger.info("switch: %s stays awake %s once idle (a request's keep_alive)", m.name,
                        "for ever" if seconds == float("inf") else f"{seconds:g} s")
        m.keep_alive_s = seconds

    async def reload(self, config: SwitchConfig) -> tuple[SwitchConfig, Reload]:
        new, change = diff(self.config, config)  # ConfigError: what a running front cannot change
        async with self.life.busy:
            starting = [n for n in (*change.removed, *change.changed)
                        if self.models[n].start_phase in STARTING_UP or self.models[n].preload in PRELOADING]
            if starting:
                raise ConfigError(f"{', '.join(starting)} is starting: reload once its start is done; the running "
                                  f"configuration stays")
            await self.life.reload(new, change)
            self.config = self.requests.config = new
        return new, change

    def close(self) -> int:
        return self.requests.close()

    async def stop(self) -> None:
        await self.life.stop_all()

    async def run(self) -> None:
        """Start-up, then every switch, one at a time, as ``schedule.plan`` says; with ``preload_jobs`` > 1
        start-up's preloads run ahead of the starts, that many at once where memory allows, and with ``start_jobs``
        > 1 up to that many starts go together where none profiles the GPU's memory (``schedule.startup_batch``)."""
        startup = self.life.begin_startup()
        startup.add_done_callback(said_if_failed)
        try:
            await self._schedule()
        finally:
            startup.cancel()

    async def _schedule(self) -> None:
        life, kick = self.life, self.life.changes.kick
        while True:
            async with life.busy:
                self._dead()
                step = self._act(plan(life.snapshot(), self.config))
                if isinstance(step, Start):
                    if len(step.names) > 1:
                        logger.info("switch: starting %s together (no start profiles the GPU's memory)",
                                    ", ".join(step.names))
                    await self._starts(list(step.names), None)
                elif isinstance(step, Wake):
                    await self._starts([step.name], step.room)
            if isinstance(step, Wait):
                try:
                    await asyncio.wait_for(kick.wait(), step.look_in_s)
                except TimeoutError:
                    pass
                kick.clear()

    def _dead(self) -> None:
        """The engines found dead outside the scheduler (``Changes.engine_gone``) marked failed, under ``busy``."""
        died, self.life.changes.died = self.life.changes.died, set()
        for name in died:
            m = self.models.get(name)  # a reload may have removed it since
            if m is not None and m.state in SERVING and not m.engine.alive():
                self.life.exited(m)

    async def engine_gone(self, m: Model) -> bool:
        """Whether ``m``'s engine is gone, asked by the port where its connection failed (``failures.gone``): if
        so the scheduler marks it failed, and this returns once it has (the request's next ``acquire`` starts it
        again)."""
        if not await gone(m):
            return False
        self.life.changes.engine_gone(m.name)
        while m.state in SERVING and not m.engine.alive():
            await self.life.changes.wait()
        return True

    def _act(self, p: Plan) -> Start | Wake | Wait:
        """The plan's first steps done (busy engines whose turn is over leave); what it does then."""
        for x in p.leave:
            if x.ahead:  # for x.for_'s streams awake beside it: it comes back by its own due, not after x.for_
                self.life.leave(self.models[x.name], f"for {x.for_}", f", its streams ahead of their deadlines and "
                                f"{x.for_}'s not: the GPU's time to {x.for_}", x.keep)
            else:
                self.life.leave(self.models[x.name], f"for {x.for_}", f", {x.waiting} wait for {x.for_}", x.keep,
                                x.for_)
        return p.then

    async def _go(self, m: Model, room: Room | None) -> None:
        """Start ``m`` (or start it again: ``room`` None), or switch to it making ``room``; start-up is ready once
        the default is (or every model has started)."""
        life = self.life
        try:
            await (life.start_up(m) if room is None else life.switch_to(m, room))
        except Exception as exc:  # never the end of the scheduler, a bug included: its requests get 503
            logger.exception("switch: %s: %s", m.name, exc)
            m.last_error = f"the switch to it failed: {exc}"
            m.ledger.refuse(m.last_error)
            life.changes.changed()
            await asyncio.sleep(0.1)  # a bug that repeats must not spin the loop
        if m.config is self.config.default or all(x.started and x.state is not S.STARTING
                                                  for x in self.models.values()):
            life.ready.set()

    async def _starts(self, names: list[str], room: Room | None) -> None:
        """Start ``names`` (``room`` None), or switch to the one of them making ``room``; a start-up's starts are
        joined by models whose preloads end meanwhile (``schedule.may_join``, ``schedule.joining``, asked again on
        every change): on an H200 the second of ten 8B had its preload done 58 s before the first's cold start
        ended, and waited for it."""
        tasks = {asyncio.create_task(self._go(self.models[x], room)): x for x in names}
        changed = asyncio.create_task(self.life.changes.wait())
        try:
            while tasks:
                done, _ = await asyncio.wait([*tasks, changed], return_when=asyncio.FIRST_COMPLETED)
                for task in done - {changed}:
                    del tasks[task]
                if changed.done():
                    changed = asyncio.create_task(self.life.changes.wait())
                s = self.life.snapshot()
                joining_now = joining(list(tasks.values()), s, self.config.start_jobs) \
                    if may_join(list(tasks.values()), s, self.config) else []
                for x in joining_now:
                    logger.info("switch: %s starts beside %s (its preload done; no start profiles the GPU's memory)",
                                x, ", ".join(tasks.values()))
                    tasks[asyncio.create_task(self._go(self.models[x], None))] = x
        finally:  # the front stops: as gather did, what goes on is cancelled with it
            for task in (*tasks, changed):
                task.cancel()

    async def retier(self) -> None:
        """Tiers from traffic: the next move of the GPU tier, if any, made (``tiers.py``)."""
        now, models = time.monotonic(), list(self.models.values())
        demand = {m.name: m.ledger.demand(now, self.config.tier_window_s) for m in models}
        slots = sum(m.config.parked_weights == "gpu" and m.engine.parks for m in models)
        if tiers.step(self.life.snapshot(), demand, self.config, slots) is None:
            return  # the common case: nothing moves, and the switches' lock is not taken
        async with self.life.busy:
            move = tiers.step(self.life.snapshot(), demand, self.config, slots)  # a switch may have gone meanwhile
            if move is None:
                return
            try:
                await tiers.apply(self.life, move)
            except (EngineError, OSError, HotweightsError) as exc:
                logger.warning("switch: %s: its move to the %s tier failed: %s", move.name, move.to, exc)

    async def watch(self, interval_s: float = 0.5) -> None:
        """Engines that died are marked failed (their next request starts them again); parked embedded engines
        idle past ``deep_park_after_s`` deepen to level 2; a model's idle timeouts park or stop it
        (``actions.idle_timeouts``)."""
        while True:
            await asyncio.sleep(interval_s)
            if self.config.tiers == "traffic" and not self.life.busy.locked():
                await self.retier()
            for m in list(self.models.values()):  # a reload may change the models meanwhile
                if m.state in SERVING and not m.engine.alive():
                    self.life.changes.engine_gone(m.name)  # the scheduler moves it
                elif self.life.busy.locked():
                    continue
                elif (m.state is S.PARKED and m.config.deep_park_after_s and m.kind.deepens_when_idle
                      and not m.kv_held and time.monotonic() - m.parked_at > m.config.deep_park_after_s):
                    async with self.life.busy:
                        try:
                            await self.life.park(m, 2)
                        except EngineError as exc:
                            logger.warning("switch: %s", exc)
                elif m.park_after_s() is not None or m.config.stop_after_s:
                    try:
                        await idle_timeouts(self.life, m)
                    except EngineError as exc:
                        logger.warning("switch: %s", exc)
