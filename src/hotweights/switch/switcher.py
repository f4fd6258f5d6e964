"""Which engine is awake: requests wait for their model, a switch parks the least recently used engine first.

One switch at a time (an ``asyncio.Lock``, whose waiters go first come, first served). A request for a model
that is not awake waits for the lock; when it holds it: while ``max_awake`` engines that share a GPU with it
are awake (models without ``gpus`` share every GPU), the least recently used one that is not ``keep_awake``
stops taking requests, its requests in flight finish (a switch never cuts a stream), and it parks; then the
model wakes (or starts again, if its engine died or cannot park). Every request waiting for that model is
then let through at once: a switch serves the whole batch that waited for it, and a model is switched to
again only in the order its requests came, so an A-B-A-B mix costs one switch per batch, not one per
request. A wake the GPU refuses for memory (``cannot wake``) parks one more awake engine on its GPUs and
tries again. A request that waits longer than ``request_timeout_s`` is answered 503, and never by another
model's engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HotweightsError
from .config import ModelConfig, SwitchConfig
from .engines import AWAKE, DEEP, FAILED, PARKED, STARTING, STOPPED, Engine, EngineError
from .metrics import SwitchMetrics

logger = logging.getLogger("hotweights.switch")


@dataclass
class Model:
    config: ModelConfig
    engine: Engine
    state: str = STARTING
    inflight: int = 0
    waiting: int = 0
    draining: bool = False
    reserved: int = 0  # waiting requests a switch already counted in flight
    last_used: float = 0.0
    parked_at: float = 0.0
    wakes: int = 0
    error: str = ""
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def row(self, gpu: dict[int, int]) -> dict[str, Any]:
        pids = self.engine.pids()
        held = sum(gpu.get(p, 0) for p in pids) if gpu and pids else None
        return {"name": self.config.name, "engine": self.config.engine, "state": self.state, "pid": self.engine.pid,
                "gpu_mib": held, "gpus": list(self.config.gpus) or None,
                "port": self.engine.port, "inflight": self.inflight, "waiting": self.waiting,
                "last_used": self.last_used or None, "wakes": self.wakes, "parks": self.engine.parks,
                "error": self.error or None, "log": str(self.engine.log_path)}


class Unavailable(Exception):
    """A request that cannot be served now (503); the message says why."""


class Switcher:
    def __init__(self, config: SwitchConfig, log_dir: Path, metrics: SwitchMetrics) -> None:
        self.config, self.metrics = config, metrics
        self.models = {m.name: Model(m, Engine(m, log_dir, config.socket_dir, config.parking)) for m in config.models}
        self.lock = asyncio.Lock()
        self.ready = asyncio.Event()  # the default model serves
        self._switches: dict[str, asyncio.Task[None]] = {}

    def awake(self) -> list[Model]:
        return [m for m in self.models.values() if m.state == AWAKE]

    def awake_beside(self, m: Model) -> list[Model]:
        """The awake engines other than ``m`` that share a GPU with it: those ``max_awake`` counts for it, and
        the ones whose park can free memory for it."""
        return [x for x in self.awake() if x is not m and x.config.shares_a_gpu(m.config)]

    def _set(self, m: Model, state: str) -> None:
        m.state = state
        self.metrics.state(m.config.name, state)

    async def start_all(self) -> None:
        """Start every engine, the default first; park the others once each is ready. One that fails is listed
        as failed (its next request tries again); the others serve."""
        default = self.config.default
        order = [self.models[default.name], *(m for m in self.models.values() if m.config is not default)]
        for m in order:
            async with self.lock:  # a request for this model waits until it is started (and parked)
                await self._start_one(m, default)
                if m.state == AWAKE and m.config.parked_weights == "host" and m.engine.parks:
                    self.ready.set()  # it serves while its host copy is made: its first park then copies nothing
                    await self._host_copy_ahead(m)
            if m.config is default:
                self.ready.set()

    async def _host_copy_ahead(self, m: Model) -> None:
        try:
            made = await asyncio.to_thread(m.engine.host_copy_ahead)
            logger.info("switch: %s: its host copy made ahead (%d entries)", m.config.name, made)
        except (EngineError, OSError, HotweightsError) as exc:
            logger.warning("switch: %s: no host copy ahead (%s); its first park makes it", m.config.name, exc)

    async def _start_one(self, m: Model, default: ModelConfig) -> None:
        began = time.monotonic()
        try:
            cached = await asyncio.to_thread(m.engine.preload)
            preloaded_s = time.monotonic() - began
            cached += f", {preloaded_s:.1f} s" if preloaded_s >= 0.1 else ""
            started = await asyncio.to_thread(m.engine.start)
            how = " from a warm standby" if m.engine.server else ""
            if m.config is default or (m.config.keep_awake and len(self.awake_beside(m)) < self.config.max_awake):
                self._set(m, AWAKE)
                m.last_used = time.time()
                note = "awake"
            else:
                moved = await self._park(m)
                note = (m.state + moved if m.engine.parks else "stopped: parking is off" if not self.config.parking
                        else "stopped: this engine has no sleep mode")
            logger.info("switch: %s ready in %.1f s (%s; started%s, %.1f s; %s)", m.config.name,
                        time.monotonic() - began, cached, how, started, note)
        except EngineError as exc:
            m.error = str(exc)
            self._set(m, FAILED)
            logger.error("switch: %s unavailable: %s", m.config.name, exc)

    async def _park(self, m: Model, level: int = 0) -> str:
        """Park ``m`` (at its configured level, or ``level``; EngineError when it would not); with
        ``parked_weights = "host"`` its weights then leave the GPU: ', N GiB to host memory' (or why they stay:
        the engine is parked either way)."""
        await asyncio.to_thread(m.engine.park, level or m.config.level)
        moved = ""
        if m.config.parked_weights == "host" and m.engine.parks:
            try:
                moved = ", " + await asyncio.to_thread(m.engine.weights_to_host)
            except (EngineError, OSError, HotweightsError) as exc:
                logger.warning("switch: %s", exc)
                moved = f", weights kept on the GPU ({exc})"
        self._park_state(m)  # once its weights are where they stay
        return moved

    def _park_state(self, m: Model) -> None:
        m.parked_at = time.monotonic()
        self._set(m, (DEEP if m.engine.level == 2 else PARKED) if m.engine.parks else STOPPED)

    async def acquire(self, name: str) -> Model:
        """The awake engine of ``name`` with this request counted in flight; Unavailable after the timeout."""
        m = self.models[name]
        m.waiting += 1
        self.metrics.waiting(name, m.waiting)
        deadline = time.monotonic() + self.config.request_timeout_s
        served = False
        try:
            while True:
                if m.reserved:  # the switch that woke it counted this batch in flight already
                    m.reserved -= 1
                    break
                if m.state == AWAKE and not m.draining:
                    m.inflight += 1
                    m.idle.clear()
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"the model `{name}` was not awake within {self.config.request_timeout_s:.0f} "
                                      f"s ({m.state}{': ' + m.error if m.error else ''})")
                task = self._switches.get(name)
                if task is None or task.done():
                    task = self._switches[name] = asyncio.create_task(self._switch_to(m))
                try:  # a request that stops waiting does not cancel the switch its batch waits for
                    await asyncio.wait_for(asyncio.shield(task), left)
                except TimeoutError:
                    continue  # the loop says it timed out
            served = True
            m.last_used = time.time()
            return m
        finally:
            m.waiting -= 1
            self.metrics.waiting(name, m.waiting)
            if not served and m.reserved:  # it gave up (timeout, client gone): its place in the batch goes
                m.reserved -= 1
                self.release(m)

    def release(self, m: Model) -> None:
        m.inflight -= 1
        m.last_used = time.time()
        if m.inflight == 0:
            m.idle.set()

    async def _switch_to(self, m: Model) -> None:
        async with self.lock:
            if m.state == AWAKE and not m.draining:
                return  # a switch before this one woke it: this request is in its batch
            began = time.monotonic()
            while len(self.awake_beside(m)) >= self.config.max_awake and await self._park_one(m):
                pass
            try:
                source = await self._wake(m)
            except EngineError as exc:
                m.error = str(exc)
                self._set(m, FAILED if not m.engine.alive() else m.state)
                logger.error("switch: %s", exc)
                raise Unavailable(str(exc)) from None
            m.error = ""
            m.wakes += 1
            m.last_used = time.time()
            self._set(m, AWAKE)
            # the batch: every request waiting for it now is in flight before the lock goes to the next switch,
            # which could otherwise park it again before they ran
            batch = max(0, m.waiting - m.reserved)
            m.reserved += batch
            m.inflight += batch
            if m.inflight:
                m.idle.clear()
            seconds = time.monotonic() - began
            self.metrics.switch(m.config.name, source, seconds)
            logger.info("switch: %s awake in %.3f s (weights %s)", m.config.name, seconds, source)

    async def _wake(self, m: Model) -> str:
        """Wake ``m`` (or start it again); a wake refused for memory parks one more engine and tries again."""
        while True:
            try:
                if m.state in (FAILED, STOPPED) or not m.engine.alive():
                    was = m.state
                    self._set(m, STARTING)
                    await asyncio.to_thread(m.engine.start)
                    return "restart" if was == FAILED else "start"
                return await asyncio.to_thread(m.engine.wake)
            except EngineError as exc:
                if "cannot wake" not in str(exc) or not await self._park_one(m):
                    raise

    async def _park_one(self, keep: Model) -> bool:
        """Park the least recently used awake engine beside ``keep`` (on a GPU of its; not kept awake), once its
        requests in flight are done; False when there is none."""
        candidates = [x for x in self.awake_beside(keep) if not x.config.keep_awake]
        if not candidates:
            return False
        victim = min(candidates, key=lambda x: x.last_used)
        victim.draining = True
        try:
            if victim.inflight:
                await victim.idle.wait()
            moved = await self._park(victim)
            logger.info("switch: %s %s for %s%s", victim.config.name, victim.state, keep.config.name, moved)
        except EngineError as exc:
            logger.error("switch: %s; stopping it", exc)
            await asyncio.to_thread(victim.engine.stop)
            self._set(victim, STOPPED)
        finally:
            victim.draining = False
        return True

    async def engine_died(self, m: Model, wait_s: float = 2.0) -> bool:
        """Whether ``m``'s engine is gone, asked when its connection failed (its process may take a moment to
        end after its socket closed): if so, it is marked failed, so that the next ``acquire`` starts it again."""
        deadline = time.monotonic() + wait_s
        while m.engine.alive():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        if m.state in (AWAKE, PARKED, DEEP):
            self._exited(m)
        return True

    def _exited(self, m: Model) -> None:
        code = m.engine.proc.returncode if m.engine.proc is not None else None
        m.error = f"its engine exited (code {code}); it starts again on the next request"
        logger.warning("switch: %s: %s", m.config.name, m.error)
        self._set(m, FAILED)

    async def watch(self, interval_s: float = 0.5) -> None:
        """Engines that died are marked failed (their next request starts them again); parked embedded engines
        idle past ``deep_park_after_s`` deepen to level 2."""
        while True:
            await asyncio.sleep(interval_s)
            for m in self.models.values():
                if m.state in (AWAKE, PARKED, DEEP) and not m.engine.alive() and not self.lock.locked():
                    self._exited(m)
                elif (m.state == PARKED and m.config.deep_park_after_s and m.config.engine == "hotweights"
                      and time.monotonic() - m.parked_at > m.config.deep_park_after_s and not self.lock.locked()):
                    async with self.lock:
                        try:
                            await self._park(m, 2)
                        except EngineError as exc:
                            logger.warning("switch: %s", exc)

    def stop_all(self) -> None:
        for m in self.models.values():
            m.engine.stop()
            self._set(m, STOPPED)
