"""An operator's control over what is loaded: park, stop or start one model (the front's
``POST /switch/models/NAME/ACTION``, ``hotweights switch ACTION NAME``), and each model's idle timeouts
(``park_after_s``, ``stop_after_s``), which the switcher's watch applies. Torch-free.

- **park**: an idle engine parks now; a busy one leaves (takes no new request) and parks once its requests end. Its
  memory is free for the others; a request for it wakes it again.
- **stop**: the engine stops now (requests in flight end; a stream with vLLM's error event): its host memory and
  GPU residue are freed too. The keeper keeps its weights; a request for it starts it again.
- **start**: the engine starts (or wakes) now and stays awake while memory allows; where memory holds it only once
  busy engines' turns end, the answer says so and nothing moves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Literal

from .upstream.engines import EngineError
from .states import ModelState

if TYPE_CHECKING:
    from .model import Model
    from .lifecycle import Lifecycle

S = ModelState
AWAKE = frozenset({S.AWAKE})
Action = Literal["park", "stop", "start"]
ACTIONS: tuple[Action, ...] = ("park", "stop", "start")
logger = logging.getLogger("hotweights.switch")


class Refused(Exception):
    """An action that cannot be done now (409), with the reason."""


async def act(s: Lifecycle, m: Model, action: Action) -> str:
    """Do ``action`` to ``m``: what was done, in a few words."""
    async with s.busy:
        if action == "park":
            return await _park(s, m, "as asked")
        if action == "stop":
            return await _stop(s, m, "as asked")
        return await _start(s, m)


async def _park(s: Lifecycle, m: Model, why: str) -> str:
    if m.state is S.AWAKE and m.inflight:
        s.leave(m, why)
        return f"leaving: it parks once its {m.inflight} request(s) in flight end"
    if m.state is S.AWAKE:
        await s.park_for(m, why)
        return str(m.state)
    if m.state is S.LEAVING:
        return "leaving already: it parks once its requests end"
    return f"{m.state} already" if m.state in (S.PARKED, S.DEEP) else f"{m.state}: nothing to park"


async def _stop(s: Lifecycle, m: Model, why: str) -> str:
    if m.state is S.STOPPED or (m.state is S.FAILED and not m.engine.alive()):
        return f"{m.state} already"
    await asyncio.to_thread(m.engine.stop)
    s.move(m, S.STOPPED)
    logger.info("switch: %s stopped %s", m.name, why)
    return "stopped"


async def _start(s: Lifecycle, m: Model) -> str:
    if m.state in (S.AWAKE, S.LEAVING):
        return f"{m.state} already"
    if not m.started:
        await s.start_up(m)
        return str(m.state)
    room = s.room(m)
    if room.wait:
        raise Refused(f"{m.name} does not fit beside the busy engines now: it wakes once a turn ends, at its next "
                      f"request")
    try:
        await s.switch_to(m, room)
    except EngineError as exc:
        raise Refused(str(exc)) from None
    if m.state not in AWAKE:  # (a set, not ``is``: the switch moved it while this awaited)
        raise Refused(m.error or f"{m.name} could not be started")
    m.last_used = time.time()
    return "awake"


async def idle_timeouts(s: Lifecycle, m: Model) -> None:
    """Park ``m`` after ``park_after_s`` idle (or a request's ``keep_alive``: ``Model.park_after_s``), stop it after
    ``stop_after_s`` idle (the watch asks each model)."""
    if m.inflight or m.waiting or not m.last_used:
        return
    idle = time.time() - m.last_used
    park_after = m.park_after_s()
    if m.config.stop_after_s and idle > m.config.stop_after_s and m.state in (S.AWAKE, S.PARKED, S.DEEP):
        async with s.busy:
            if not (m.inflight or m.waiting) and m.state in (S.AWAKE, S.PARKED, S.DEEP):
                await _stop(s, m, f"after {idle:.0f} s idle (stop_after_s)")
    elif (park_after is not None and idle > park_after and m.state is S.AWAKE and not m.config.keep_awake
          and m.engine.parks):
        why = "park_after_s" if m.keep_alive_s is None else "a request's keep_alive"
        async with s.busy:
            if not (m.inflight or m.waiting) and m.state is S.AWAKE:
                await _park(s, m, f"after {idle:.0f} s idle ({why})")
