"""Which engine is awake: requests wait for their model (``acquire``); one scheduler (``run``) starts, parks and
wakes engines, one at a time, in the order ``schedule.py`` gives.

To switch to a model, while ``max_awake`` engines that share a GPU with it are awake (a model without ``gpus``
shares every GPU), one that is not ``keep_awake`` stops taking requests, its requests in flight finish (a switch
never cuts a stream) and it parks (still busy after ``overlap_after_s``, it parks once they end, and the model
wakes beside it where memory allows); then the model wakes (or starts again, if its engine died or cannot park) and
every request waiting for it goes through at once: a switch serves the whole batch that waited for it. A wake
refused for memory (``WakeRefused``) parks one more engine on its GPUs and tries again. Start-up starts every
engine in turn, the default first and awake, the others parked; a request for a model start-up has not reached
moves it to the front, and keeps it awake. States and failures: ``states.py``. A request that waits longer than
``request_timeout_s`` is answered 503, and never by another model's engine.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .. import evidence
from ..errors import HotweightsError
from .engines import EngineError
from .model import Model
from .operations import Operations
from .schedule import next_model, refusal, retried
from .states import SERVING, Failure, InvalidTransition, ModelState

S = ModelState
logger = logging.getLogger("hotweights.switch")


class Unavailable(Exception):
    """A request that cannot be served now (503); the message says why."""


class Switcher(Operations):
    async def acquire(self, name: str) -> Model:
        """The awake engine of ``name`` with this request counted in flight; Unavailable when it cannot be."""
        m = self.models[name]
        arrived = time.monotonic()
        m.waiting += 1
        m.arrivals.append(arrived)
        self.metrics.waiting(name, m.waiting)
        failed, served = m.attempts_failed, False
        try:
            while True:
                if m.reserved:  # the switch that woke it counted this batch in flight already
                    m.reserved -= 1
                    break
                if m.state is S.AWAKE and not m.draining:
                    m.inflight += 1
                    m.idle.clear()
                    break
                if m.attempts_failed != failed:  # the switch this request waited for failed
                    raise Unavailable(m.error or f"the model `{name}` could not be woken")
                if said := refusal(m):
                    raise Unavailable(said)
                left = arrived + self.config.request_timeout_s - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"the model `{name}` was not awake within {self.config.request_timeout_s:.0f} "
                                      f"s ({m.state}{': ' + m.error if m.error else ''})")
                moved = self._moved
                self._kick.set()
                try:
                    await asyncio.wait_for(moved.wait(), left)
                except TimeoutError:
                    pass  # the loop says it timed out
            served = True
            m.last_used = time.time()
            return m
        finally:
            m.waiting -= 1
            m.arrivals.remove(arrived)
            self.metrics.waiting(name, m.waiting)
            if not served and m.reserved:  # it gave up (timeout, client gone): its place in the batch goes
                m.reserved -= 1
                self.release(m)

    def release(self, m: Model) -> None:
        m.inflight -= 1
        m.last_used = time.time()
        if m.inflight == 0:
            m.idle.set()

    async def run(self) -> None:
        """Start-up, then every switch, one at a time, in the order ``next_model`` gives; with ``preload_jobs`` > 1
        start-up's preloads run ahead of the starts, that many at once where memory allows."""
        preloading = self.begin_preloads(self.config.preload_jobs)
        try:
            await self._schedule()
        finally:
            if preloading is not None:
                preloading.cancel()

    async def _schedule(self) -> None:
        while True:
            m = next_model(self.models.values(), self.config, self.models[self.config.default.name])
            if m is None:
                await self._kick.wait()
                self._kick.clear()
                continue
            async with self.busy:
                try:
                    await (self._start_up(m) if not m.started or m in retried([m]) else self._switch_to(m))
                except (OSError, HotweightsError, InvalidTransition) as exc:  # never the end of the scheduler
                    logger.exception("switch: %s: %s", m.name, exc)
                    m.attempts_failed += 1
                    m.failure = Failure("wake", f"the switch to it failed: {exc}")
                    self._changed()
                    await asyncio.sleep(0.1)  # a bug that repeats must not spin the loop
            if m.config is self.config.default or all(x.started for x in self.models.values()):
                self.ready.set()

    async def _switch_to(self, m: Model) -> None:
        began = time.monotonic()
        parked = await self._make_room(m)
        if m.state is S.AWAKE:  # it was to park once its requests ended (a model woke beside it): it stays
            self._stays(m)
            logger.info("switch: %s stays awake (it was to park once its requests ended)", m.name)
            return
        woke_began = time.monotonic()
        try:
            source = await self._wake(m)
        except EngineError as exc:
            logger.error("switch: %s", exc)
            if m.state is S.STARTING:
                self._start_failed(m, exc)
            else:
                m.attempts_failed += 1
                if not m.engine.alive() and m.state in SERVING:
                    self._exited(m)
                m.failure = m.failure or Failure("wake", str(exc))
                self._changed()
            return
        m.wakes += 1
        self._awake(m)
        seconds = time.monotonic() - began
        self.metrics.switch(m.name, source, seconds)
        logger.info(evidence.switch_awake(m.name, seconds, source, parked, time.monotonic() - woke_began))

    async def watch(self, interval_s: float = 0.5) -> None:
        """Engines that died are marked failed (their next request starts them again); parked embedded engines
        idle past ``deep_park_after_s`` deepen to level 2."""
        while True:
            await asyncio.sleep(interval_s)
            for m in self.models.values():
                if self.busy.locked():
                    break
                if m.state in SERVING and not m.engine.alive():
                    self._exited(m)
                elif (m.state is S.PARKED and m.config.deep_park_after_s and m.config.engine == "hotweights"
                      and time.monotonic() - m.parked_at > m.config.deep_park_after_s):
                    async with self.busy:
                        try:
                            await self._park(m, 2)
                        except EngineError as exc:
                            logger.warning("switch: %s", exc)
