"""Parking the embedded server: ``POST /sleep?level=N``, ``POST /wake_up``, ``GET /is_sleeping`` (vLLM's shapes).

A park waits for the generations in flight (new ones are refused with 503 from the moment it is asked),
then frees what it can:

- level 1 keeps the weights mapped: the keeper's entry stays shared and nothing is copied anywhere; what
  goes is what the engine holds besides them (the allocator's cached blocks on a GPU, garbage);
- level 2 also unmaps the weights. Zero-copy weights are unmapped at their addresses
  (``loading.resident``) and waking maps the same key there again: from the keeper's entry, else from
  its host copy (published back). Weights of the engine's own (copy mode, a disk start), or mapped ones
  the keeper no longer holds in any tier, go back to the meta device (``engines.modules.detach_module``);
  waking then loads the start's weights through the server's own policy (``loading.policy.load_tensors``:
  the keeper's entry, else what the fallback setting says, logged as any start's) into the same modules.
  A wake that fails (a strict start whose weights the keeper no longer holds) leaves the engine parked
  and says why.

The keeper is told of each park and wake (``resident.announce``), so ``hotweights status`` lists the
engines parked on an entry.

While parked, generation requests get 503 (``engine_sleeping``) and ``/health`` answers 503 (vLLM's says
200: a balancer should not send requests to an engine that cannot serve them). Evidence lines:
``evidence.parked`` and ``evidence.woke``.

A park that keeps its generations (``POST /sleep?level=N&mode=keep``, as vLLM's ``/pause?mode=keep``; the switch's
preempt asks it) does not wait for them: the generation in flight stops between two decoding steps (the engine's
gate, ``engine.Engine.pause``) with its KV cache where it is (a level-2 park gives back only the weights), its
stream open and silent, and the jobs queued behind it wait; the wake maps the weights again and each goes on from
its next step. Nothing is computed again: the prompt tokens counted once (``/metrics``).

Not covered: new requests while parked (they are refused, not held).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import evidence
from ..engines.modules import attach_module, detach_module
from ..loading import resident
from .engine import Engine

logger = logging.getLogger(__name__)
DRAIN_S = 60.0  # how long a park waits for the generations in flight


class ParkError(Exception):
    """A park or a wake that cannot be done now; the message says why and what to do."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class Parking:
    """``reload()``: the weights of this start again, as ``(tensors, where they came from)``."""

    def __init__(self, engine: Engine, model: Any, name: str, reload: Callable[[], tuple[dict, str]]) -> None:
        self.engine, self.model, self.name, self.reload = engine, model, name, reload
        self.level = 0  # 0: awake
        self.closing = False  # a park was asked: no new generation
        self._lock = threading.Lock()  # one park or wake at a time

    @property
    def is_sleeping(self) -> bool:
        return self.level > 0 or self.closing

    def sleep(self, level: int, keep: bool = False) -> str:
        """Park at ``level`` (1 or 2; deeper than now, or nothing to do); the evidence line. ``keep``: the
        generations in flight pause where they are (their KV caches kept) rather than end first."""
        if level not in (1, 2):
            raise ParkError(f"level must be 1 or 2, got {level}", status=400)
        with self._lock:
            if level <= self.level:
                return f"{self.name} is parked at level {self.level} already"
            start = time.perf_counter()
            self.closing = True
            if not (self.engine.pause(DRAIN_S) if keep else self.engine.wait_idle(DRAIN_S)):
                self.closing = self.level > 0
                raise ParkError(f"generations still running after {DRAIN_S:.0f} s; park again when they end")
            freed = 0
            if level == 2:
                freed = resident.unmap_all() if resident.held() else detach_module(self.model)
            freed += _release_caches()
            self.level, self.closing = level, False
            line = evidence.parked(self.name, level, freed, time.perf_counter() - start, weights_mapped=level < 2)
        logger.info(line)
        resident.announce(level, _gpu_residue())
        return line

    def wake(self) -> str:
        """Serve again; the evidence line. ParkError (503) when the weights cannot be had (it stays parked)."""
        with self._lock:
            if not self.level:
                return f"{self.name} is awake"
            start = time.perf_counter()
            again = self._weights_again() if self.level == 2 else None
            self.level = 0
            self.engine.resume()  # generations a park kept go on (a no-op where none was kept)
            line = evidence.woke(self.name, time.perf_counter() - start, again and again.source,
                                 again.rate() if again else "")
        logger.info(line)
        resident.announce(0, 0)
        return line

    def _weights_again(self) -> resident.Remapped:
        """The weights of a deep park back in the model; where they came from."""
        if any(not h.mapped for h in resident.held()):
            try:
                return resident.map_again()
            except resident.WeightsGone as exc:
                logger.warning("%s; loading this start's weights as a start would", exc)
                detach_module(self.model)
                resident.forget_unmapped()
        try:
            tensors, source = self.reload()
        except Exception as exc:  # the policy's own message (strict: what to do)
            raise ParkError(f"cannot wake {self.name}: {exc}; it stays parked", status=503) from None
        attach_module(self.model, tensors)
        return resident.Remapped(source)


def _gpu_residue() -> int:
    """What this process still holds on its GPU (0 on the CPU): the keeper counts it for starts beside it."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    from ..pools.devices import process_gpu_bytes

    return process_gpu_bytes(torch.cuda.current_device())


def _release_caches() -> int:
    """What the allocators give back once a park dropped references: bytes of the GPU allocator's cache."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, before - torch.cuda.memory_reserved())
