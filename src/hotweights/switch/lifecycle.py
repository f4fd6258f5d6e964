"""What the switch does to its engines, one at a time (``busy``): the moves between states (``move``, the only
door), a start-up, a park, a wake, making room beside a model, a stop. ``switcher.Switcher`` decides when, and
``admission.Admission`` lets requests in; both learn of every change through ``Changes``. Torch-free."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable

from .. import evidence
from ..errors import HotweightsError
from . import failures
from .config import ModelConfig, SwitchConfig
from .running import Reload
from .upstream.engines import EngineError, EngineLike, WakeRefused
from .metrics import SwitchMetrics
from .model import Changes, Model, Switched, lately
from .preempt import pause_all
from .admit import start_to_reserve_for
from .schedule import Room, room_for, startup_order, victim
from .snapshot import Snapshot
from .startup import Startup
from .states import (SERVING, STARTS_GOING_ON, TRANSITIONS, Failure, InvalidTransition, ModelState,
                     StartState, WakeSource)

S = ModelState
logger = logging.getLogger("hotweights.switch")


class Lifecycle:
    """The engines' lifecycle: its public methods are what the scheduler and the operator's actions do to a model;
    each runs under ``busy`` (the caller holds it), and ends in ``move``."""

    def __init__(self, config: SwitchConfig, metrics: SwitchMetrics, engines: Callable[[ModelConfig], EngineLike],
                 totals: dict[int, int] | None = None) -> None:
        self.config, self.metrics = config, metrics
        self.totals = totals if totals is not None else {}  # each GPU's MiB (nvidia-smi, once): memory bounds wakes
        self.engines = engines
        self.models = {m.name: Model(m, engines(m), S.STARTING if m.start == "eager" else S.STOPPED)
                       for m in config.models}  # a cached or lazy model's engine starts for its first request
        self.busy = asyncio.Lock()  # held by the one start, park or wake going on
        self.ready = asyncio.Event()  # start-up reached the default model
        self.changes = Changes()
        self._tasks: set[asyncio.Task[None]] = set()
        self.switched: deque[Switched] = deque(maxlen=20)  # the last switches, for the status page
        jobs = config.preload_jobs
        self.startup = Startup(list(self.models.values()), jobs, jobs > 1, self.snapshot,
                               lambda s: start_to_reserve_for(s, config), self.changes, self.pin_kv_as,
                               compile_ahead=config.compile_ahead, read_ahead=config.read_ahead)
        self.startup.models = [self.models[v.name] for v in startup_order(self.snapshot())]

    async def reload(self, new: SwitchConfig, change: Reload) -> None:
        """A new configuration (``config.diff``: what it changes), under ``busy``: the removed and changed models'
        engines stopped (their streams end; the requests waiting for a removed one are answered 503), a changed
        model taken back to the beginning of its start-up with its new table (its requests waiting keep waiting,
        for its new engine), added models made; the scheduler then starts them as start-up does. The others are
        untouched: their engines, streams and states."""
        tables = {c.name: c for c in new.models}
        gone = [self.models[n] for n in (*change.removed, *change.changed)]
        await asyncio.gather(*(asyncio.to_thread(m.engine.stop) for m in gone))
        for m in gone:
            if m.state is not S.STOPPED:
                self.move(m, S.STOPPED)
        for name in change.removed:
            self.models[name].ledger.refuse(f"the model `{name}` was removed from the front's configuration")
        for name in change.changed:
            m = self.models[name]
            self.startup.forget(m)
            m.engine, m.crashes, m.keep_alive_s, m.tier = self.engines(tables[name]), 0, None, None
        self.config = new
        models = {}
        for c in new.models:  # in the new order; each keeps its Model (its requests), with the new table
            m = models[c.name] = self.models.get(c.name) or Model(c, self.engines(c), S.STOPPED)
            m.config = c
            if m.state is S.STOPPED and not m.started and c.start == "eager":
                self.move(m, S.STARTING)  # start-up starts it
        self.models.clear()
        self.models.update(models)
        self.startup.models = [self.models[v.name] for v in startup_order(self.snapshot())]
        self.changes.changed()

    def begin_startup(self) -> asyncio.Task[None]:
        """Start-up's jobs (``startup.py``: the preloads, ahead of the starts with ``preload_jobs`` > 1): their
        task, for as long as the front runs."""
        return asyncio.create_task(self.startup.run(), name="start-up's jobs")

    def move(self, m: Model, to: ModelState, failure: Failure | None = None) -> None:
        """The one way a model changes state; a move the table does not allow is refused (a bug: logged, raised).
        A move to ``FAILED`` takes its ``failure``, and only that move: every other move clears it."""
        if to not in TRANSITIONS[m.state] or (to is S.FAILED) != (failure is not None):
            logger.error("switch: %s: refused move %s -> %s (%s)", m.name, m.state, to, failure)
            raise InvalidTransition(f"{m.name}: {m.state} -> {to} is not a move of the switch"
                                    + (" (a failed model needs its failure)" if to is S.FAILED and failure is None
                                       else " (only a failed model has a failure)" if failure is not None else ""))
        m.state, m.failure = to, failure
        if to not in (S.LEAVING, S.PARKED, S.DEEP):  # awake, or no engine: nothing held
            m.kv_held = False
        if to is S.AWAKE:  # those that left for it have given it its turn
            for other in self.models.values():
                other.left_for = "" if other.left_for == m.name else other.left_for
        self.metrics.state(m.name, to)
        self.changes.changed()

    def snapshot(self) -> Snapshot:
        """The switch now, as ``schedule.py`` decides over it: one frozen value, taken with no await (the caller holds
        ``busy`` where it acts on what is decided)."""
        st = self.startup
        running, compiling = st.needs()
        return Snapshot(tuple(m.view() for m in self.models.values()), dict(self.totals), time.monotonic(),
                        self.config.default.name, st.jobs, st.ahead, running, compiling, st.first_start_compiles())

    def room(self, m: Model, capped: bool = True) -> Room:
        """What must make room for ``m`` now (``schedule.room_for`` over a snapshot; ``capped``: ``max_awake``
        counts, as it does not for a start that parks right after)."""
        config = self.config if capped else dataclasses.replace(self.config, max_awake="auto")
        s = self.snapshot()
        return room_for(s[m.name], s, config)

    def exited(self, m: Model) -> None:
        """``m``'s engine died while it served: failed (under ``busy``), started again by its next request; the
        default model's and a kept-awake one's by the scheduler itself (``schedule.restarts_now``), at once or after
        the back-off of a crash loop (``failures.died``)."""
        now = time.monotonic()
        m.crashes = failures.crashes(m, now)
        failure, backoff = failures.died(m, m.config is self.config.default or m.config.keep_awake, now)
        logger.warning("switch: %s: %s", m.name, failure.message)
        self.move(m, S.FAILED, failure)
        if backoff:
            asyncio.get_running_loop().call_later(backoff, self.changes.kick.set)  # then the scheduler restarts it

    async def start_up(self, m: Model) -> None:
        """Preload and start ``m`` (idle engines park first where it would not fit beside them); it stays awake when
        it is the default, a request waits for it, or it is kept awake; else it parks."""
        if m.state is S.FAILED:  # its start failed and its back-off is over: start-up tries it again
            logger.info("switch: %s: starting again (%d failed start(s) before)", m.name, m.start_failures)
            self.move(m, S.STARTING)
        elif m.state is S.STOPPED:  # a cached or lazy model, for its first request
            self.move(m, S.STARTING)
        self.startup.start_moves(m, StartState.PREPARING)
        began = time.monotonic()
        try:
            outcome, preloaded_s = await self.startup.result(m)
            cached = str(outcome)
            stays = m.config is self.config.default or m.waiting > 0 or m.config.keep_awake
            await self._make_room(Room(park=self.room(m, capped=stays).park), m)
            waited = await self.startup.compiled(m)  # it compiled ahead
            started = await self._start(m)
            cached += f", {preloaded_s:.1f} s" if preloaded_s >= 0.1 else ""
            cached += f"; its compile ahead waited for, {waited:.1f} s more" if waited >= 0.1 else ""
        except EngineError as exc:
            self._start_failed(m, exc)
            logger.error("switch: %s unavailable: %s", m.name, exc)
            return
        m.start_failures = 0
        self.pin_kv_as(m)
        how = " from a warm standby" if m.engine.server else ""
        awake = m.config is self.config.default or m.waiting or m.config.keep_awake
        if awake and not stays:  # a request came while it started: room for it, as for a wake, or it parks
            room = self.room(m)
            awake = not (room.leave or room.wait)  # busy engines' turns first: the scheduler wakes it in turn
            await self._make_room(Room(park=room.park) if awake else Room(), m)
        if awake:
            self._awake(m)
            note = "awake" + (f", for {m.waiting} waiting request(s)" if m.waiting else "")
            if m.placed.parked_weights == "host" and m.engine.parks:
                if m.config is self.config.default:
                    self.ready.set()  # it serves while its host copy is made (seconds for an 8B)
                await self._host_copy_ahead(m)
        else:
            m.last_used = m.last_used or time.time()  # its idle timeouts count from here
            moved = await self.park(m)
            note = (m.state + moved if m.engine.parks else "stopped: parking is off" if not self.config.parking
                    else "stopped: this engine has no sleep mode")
        logger.info("switch: %s ready in %.1f s (%s; started%s, %.1f s; %s)", m.name, time.monotonic() - began,
                    cached, how, started, note)

    def pin_kv_as(self, m: Model) -> None:
        """Where ``m``'s engine sized its KV cache from a profile of the GPU's memory, the models yet to start that
        would start as it did have theirs pinned to that size (``Engine.pin_kv_as``): vLLM's profile reads the whole
        GPU, so each such start went alone, one after another, with no preload beside it (three 8B with the front's
        defaults on an H200: 60.4 s and 31.5 s after the first, each preload 4.5 s between them); pinned, they start
        together and beside the preloads, with the KV cache the profile gives them. Asked once ``m``'s profile is
        done, while it still starts (``Startup.start_moves``), and again once it is up; each model is pinned once."""
        pinned = {x.name: n for x in self.models.values() if not x.started and (n := x.engine.pin_kv_as(m.engine))}
        if not pinned:
            return
        self.changes.changed()  # their needs changed with their arguments
        logger.info("switch: %s start with the KV cache vLLM's profile gave %s (%s; --kv-cache-memory-bytes %d): "
                    "they profile nothing, so they start beside each other and the preloads", ", ".join(pinned),
                    m.name, evidence.size_text(min(pinned.values())), min(pinned.values()))

    async def _start(self, m: Model) -> float:
        """Start ``m``'s engine, with no preload beside it on its GPUs where its start profiles the GPU's memory
        (``Startup.alone``)."""
        await self.startup.alone(m)
        try:
            took = await asyncio.to_thread(m.engine.start)
        except EngineError:
            self.startup.start_moves(m, StartState.FAILED)
            raise
        self.startup.start_moves(m, StartState.UP)
        m.up_since = time.monotonic()
        return took

    def _start_failed(self, m: Model, exc: EngineError) -> None:
        """A start that failed is not tried again by every request: after its back-off (``failures.start_failed``)
        or at once when the checkpoint's files change."""
        m.start_failures += 1
        if m.start_phase is StartState.PREPARING or m.start_phase in STARTS_GOING_ON:
            self.startup.start_moves(m, StartState.FAILED)
        failure, backoff = failures.start_failed(m, str(exc), time.monotonic())
        self.move(m, S.FAILED, failure)
        m.ledger.refuse(failure.message)
        asyncio.get_running_loop().call_later(backoff, self.changes.kick.set)  # then the scheduler tries it again

    async def _host_copy_ahead(self, m: Model) -> None:
        try:
            made = await asyncio.to_thread(m.engine.host_copy_ahead)
            logger.info("switch: %s: its host copy made ahead (%d entries)", m.name, made)
        except (EngineError, OSError, HotweightsError) as exc:
            logger.warning("switch: %s: no host copy ahead (%s); its first park makes it", m.name, exc)

    def _awake(self, m: Model) -> None:
        """``m`` serves: every request waiting for it now is in flight before the next switch, which could otherwise
        park it again before they ran."""
        m.start_failures, m.last_error = 0, ""
        m.awake_at = time.monotonic()
        self.move(m, S.AWAKE)
        m.ledger.let_in()  # every request waiting goes through at once

    async def _make_room(self, room: Room, m: Model) -> list[tuple[str, float, bool]]:
        """Park ``room``'s idle engines for ``m``, all at once: each ``(its name, seconds parking it, whether it
        parked)`` (one that does not park is stopped). Each park is a call to its own engine, 11-37 ms on an H200
        (ten 8B): a wake that parked five waited for each in turn, 64 ms before its own began."""
        async def one(victim: Model) -> tuple[str, float, bool]:
            began = time.monotonic()
            parked = await self.park_for(victim, f"for {m.name}") and victim.engine.parks
            return victim.name, time.monotonic() - began, parked

        idle = [x for n in room.park if (x := self.models[n]).state is S.AWAKE and not x.inflight]  # nothing went
        # in since the plan
        for x in idle:  # now, not as each park's task begins: a request that came between would go to a sleeping
            self.move(x, S.LEAVING)  # engine (a 503 from it, seen once in CI under Ray)
        return list(await asyncio.gather(*(one(x) for x in idle)))

    async def switch_to(self, m: Model, room: Room) -> None:
        """Make ``room`` for ``m`` and wake it (or start it again); a wake that fails is its requests' answer."""
        began = time.monotonic()
        waited = m.waited_s(began)
        parked = await self._make_room(room, m)
        woke_began = time.monotonic()
        try:
            source = await self._wake(m)
        except EngineError as exc:
            logger.error("switch: %s", exc)
            if m.state is S.STARTING:
                self._start_failed(m, exc)
            else:  # it died as it was asked, or it stays where it was (parked): the requests that waited are told
                if not m.engine.alive() and m.state in SERVING:
                    self.exited(m)
                else:
                    m.last_error = str(exc)
                m.ledger.refuse(m.error)
                self.changes.changed()
            return
        m.wakes += 1
        self._awake(m)
        seconds = time.monotonic() - began
        m.wake_s = lately(m.wake_s, seconds)  # the deadline schedule's estimate
        self.metrics.switch(m.name, source, seconds)
        self.switched.append(Switched(time.time(), m.name, seconds, source, waited, tuple(n for n, *_ in parked)))
        logger.info(evidence.switch_awake(m.name, seconds, source, parked, time.monotonic() - woke_began, waited))

    def leave(self, victim: Model, why: str, waiting: str = "", keep: bool = False, to: str = "") -> None:
        """``victim`` takes no new request and parks once its requests in flight end (``why``: ``for B``, where B
        (``to``) wakes after it, or as an operator asked); with ``preempt``, its streams that may be paused pause now,
        each continued on its next wake (``preempt.py``), or with ``keep`` (where its park keeps them) held on its
        engine with their KV caches, going on at its next wake with nothing computed again."""
        self.move(victim, S.LEAVING)
        victim.left_for = to
        paused = self.pause_streams(victim, keep)  # keep: the plan's, only where its engine's park can (can_hold)
        victim.kv_held = keep and paused > 0
        how = "held with their KV caches, going on" if victim.kv_held else "paused, continued"
        logger.info("switch: %s leaves %s: %d request(s) in flight end first%s%s", victim.name, why,
                    victim.inflight - paused, f" ({paused} {how} at its next wake)" if paused else "", waiting)

        async def park_once_idle() -> None:
            if victim.inflight:
                await victim.idle.wait()
            async with self.busy:
                if victim.state is S.LEAVING:
                    await self.park_for(victim, f"{why} once its requests ended")

        task = asyncio.create_task(park_once_idle())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wake(self, m: Model) -> WakeSource:
        """Wake ``m`` (or start it again, also when it dies as it is asked); a wake refused for memory parks one
        more engine and tries again."""
        while True:
            if m.state in (S.FAILED, S.STOPPED) or not m.engine.alive():
                was = m.state
                self.move(m, S.STARTING)
                await self._start(m)  # EngineError: the start failed
                return WakeSource.RESTART if was is S.FAILED else WakeSource.START
            try:
                return await asyncio.to_thread(m.engine.wake)
            except WakeRefused:
                if not await self._park_one(m):
                    raise
            except EngineError:
                if not await self.engine_died(m):  # alive and refusing: its reason is the answer
                    raise

    async def engine_died(self, m: Model) -> bool:
        """Whether ``m``'s engine is gone, asked under ``busy`` where it refused a wake (``gone``): if so it is
        marked failed, and the wake in progress starts it again."""
        if not await failures.gone(m):
            return False
        if m.state in SERVING:
            self.exited(m)
        return True

    def pause_streams(self, m: Model, keep: bool = False) -> int:
        """With ``preempt``, ``m``'s streams that may be paused pause (``preempt.pause_all``); how many."""
        return pause_all(m.streams, keep) if self.config.preempt else 0

    async def _park_one(self, keep: Model) -> bool:
        """Park one more awake engine beside ``keep`` (not kept awake), once its requests in flight are done: the
        GPU refused ``keep``'s wake for memory, so the memory model's estimate was short. False when there is none."""
        name = victim(self.snapshot(), keep.name, self.config)  # planned again
        if name is None:
            return False
        other = self.models[name]
        self.move(other, S.LEAVING)
        self.pause_streams(other)
        if other.inflight:
            await other.idle.wait()
        await self.park_for(other, f"for {keep.name} (its wake was refused for memory)")
        return True

    async def park_for(self, victim: Model, why: str) -> bool:
        """Park ``victim`` (logged with ``why``: ``for B``, ...; it takes no new request meanwhile); one that would not
        park is stopped (False)."""
        if victim.state is S.AWAKE:
            self.move(victim, S.LEAVING)
        try:
            moved = await self.park(victim)
        except EngineError as exc:
            logger.error("switch: %s; stopping it", exc)
            await asyncio.to_thread(victim.engine.stop)
            self.move(victim, S.STOPPED)
            return False
        logger.info("switch: %s %s %s%s", victim.name, victim.state, why, moved)
        return True

    async def park(self, m: Model, level: int = 0) -> str:
        """Park ``m`` at its configured level (or ``level``; EngineError when it would not); with ``parked_weights
        = "host"`` its weights then leave the GPU: ', N GiB to host memory' (or why they stay)."""
        level, began = level or m.placed.level, time.monotonic()
        await asyncio.to_thread(m.engine.park, level, m.kv_held)
        moved = ""
        if m.placed.parked_weights == "host" and m.engine.parks:
            try:
                moved = ", " + await asyncio.to_thread(m.engine.weights_to_host)
            except (EngineError, OSError, HotweightsError) as exc:
                logger.warning("switch: %s", exc)
                moved = f", weights kept on the GPU ({exc})"
        m.parked_at = time.monotonic()  # once its weights are where they stay
        m.park_s = lately(m.park_s, m.parked_at - began)  # the deadline schedule's estimate
        self.move(m, (S.DEEP if level == 2 or m.state is S.DEEP else S.PARKED) if m.engine.parks else S.STOPPED)
        return moved

    async def stop_all(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(m.engine.stop) for m in self.models.values()))
        for m in self.models.values():
            if m.state is not S.STOPPED:
                self.move(m, S.STOPPED)
