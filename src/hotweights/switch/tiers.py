"""Tiers from traffic (issue 69, part 3; ``tiers = "traffic"``): the GPU tier keeps as many models' parked weights on
the GPU as the configuration names (``parked_weights = "gpu"``), and which models hold it follows demand, the busiest
over the last ``tier_window_s`` seconds; the others park in host memory. Torch-free.

A move is two steps, each a pure function of a snapshot and the models' demand (``step``), so that the GPU never
holds more parked weights than planned:

1. **Demote** the quietest GPU-tier model, where the busiest host-tier model's estimated gain over the next window
   beats what the move costs:

   - gain: a request for a model parked in host memory may need a wake from there, which costs that model's wakes
     lately (else 1 s) against a GPU-tier wake (0.1 s); the move saves the difference for the requests the busier
     model gets over the quieter one's: ``(rate_busy - rate_quiet) * (wake_host - wake_gpu) * tier_window_s``;
   - cost: two copies, the busier model's weights onto the GPU and the quieter one's into host memory, each its size
     at ``COPY_MIB_S`` (an 8B's host copy uploaded in about 6 s on an H200), at least ``MIN_COPY_S`` each.

   Its weights leave the GPU at once where it is parked and its engine can deepen its park (the embedded engine: a
   level-2 park, then its weights to host memory); one awake keeps them until its next park, which is then a host
   tier's. With equal rates nothing moves: the gain is 0.
2. **Promote** the busiest host-tier model once the GPU tier has a place and its weights fit there by the memory model
   (``memory.over_mib``; while the demoted engine is awake its weights still count): parked, its GPU copy is made
   from its host copy at once, so that its next wake maps it (``Engine.device_copy_back``); awake, its next park keeps
   them.

Not moved: models kept awake, models holding streams with their KV caches, and (their engines cannot deepen a park,
as vLLM's cannot) GPU-tier vLLM models while parked: such a model is demoted only once it is awake.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import ParkedWeights, SwitchConfig
from .memory import over_mib
from .turns import DEFAULT_WAKE_S
from .snapshot import Snapshot, View
from .states import ModelState

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

logger = logging.getLogger(__name__)
S = ModelState
COPY_MIB_S = 2600  # MiB/s of a host copy made on the GPU again (an 8B's 15.3 GiB in about 6 s, H200)
MIN_COPY_S = 1.0  # a copy counted at least this long: no move for noise between small models
PLACED = (S.AWAKE, S.LEAVING, S.PARKED, S.DEEP)


@dataclass(frozen=True)
class Move:
    """``name`` goes to the GPU tier (``to = "gpu"``) or to host memory (``to = "host"``), for ``why``."""

    name: str
    to: ParkedWeights
    why: str


def step(s: Snapshot, demand: Mapping[str, float], config: SwitchConfig, slots: int) -> Move | None:
    """The next move of the tiers (``slots``: the GPU tier's size, as configured; ``demand``: each model's requests a
    second over the window), else None: see the module's docstring."""
    tiered = [v for v in s.models if v.parks and v.started and not v.config.keep_awake and v.state in PLACED]
    host = sorted((v for v in tiered if v.config.parked_weights == "host"), key=lambda v: -demand.get(v.name, 0.0))
    gpu = [v for v in s.models if v.config.parked_weights == "gpu" and v.parks]
    if not host:
        return None
    busy = host[0]
    if len(gpu) < slots:
        if _fits_on_gpu(busy, s):
            return Move(busy.name, "gpu", f"{demand.get(busy.name, 0.0):.2f} requests/s, the busiest in host memory")
        return None
    quiet = [v for v in gpu if v in tiered and v.config.shares_a_gpu(busy.config) and not v.kv_held
             and (v.state in (S.AWAKE, S.LEAVING) or v.deepens)]
    if not quiet:
        return None
    # the quietest; of equals, a parked one (its weights leave now), the least recently used
    cold = min(quiet, key=lambda v: (demand.get(v.name, 0.0), v.state in (S.AWAKE, S.LEAVING), v.last_used))
    gain, cost = gain_s(busy, cold, demand, config), cost_s(busy) + cost_s(cold)
    if gain <= cost:
        return None
    return Move(cold.name, "host", f"{busy.name} gets {demand.get(busy.name, 0.0):.2f} requests/s to its "
                                   f"{demand.get(cold.name, 0.0):.2f}: {gain:.0f} s of wakes saved over "
                                   f"{config.tier_window_s:.0f} s against {cost:.1f} s of copies")


def gain_s(busy: View, cold: View, demand: Mapping[str, float], config: SwitchConfig) -> float:
    """Seconds of wakes saved over the next window by ``busy`` on the GPU tier in place of ``cold``."""
    host_wake = busy.wake_s if busy.wake_s is not None else DEFAULT_WAKE_S[False]
    saved = max(0.0, host_wake - DEFAULT_WAKE_S[True])
    return (demand.get(busy.name, 0.0) - demand.get(cold.name, 0.0)) * saved * config.tier_window_s


def cost_s(v: View) -> float:
    """What copying ``v``'s weights between host memory and the GPU takes, by their size."""
    return max(MIN_COPY_S, v.need.weights_mib / COPY_MIB_S)


def _fits_on_gpu(v: View, s: Snapshot) -> bool:
    """Whether ``v``'s weights kept on the GPU while it is parked fit beside the others as they are now."""
    kept = dataclasses.replace(v, config=dataclasses.replace(v.config, parked_weights="gpu"))
    holders = [(kept if x.name == v.name else x).holder() for x in s.models]
    return all(over_mib(g, s.totals[g], holders) <= 0 for g in v.need.gpus if g in s.totals)


async def apply(life: Lifecycle, move: Move) -> None:
    """Make ``move`` (under ``life.busy``): see the module's docstring."""
    m = life.models[move.name]
    m.tier = move.to
    done = "at its next park"
    if move.to == "host" and m.state is S.PARKED:
        done = "now: " + (await life.park(m, 2)).lstrip(", ")
    elif move.to == "host" and m.state is S.DEEP:
        done = "now: " + await asyncio.to_thread(m.engine.weights_to_host)
    elif move.to == "gpu" and m.state in (S.PARKED, S.DEEP):
        done = "now: " + (await asyncio.to_thread(m.engine.device_copy_back) or "its GPU copy there already")
    logger.info("switch: %s moves to the %s tier (%s); %s", m.name, "GPU" if move.to == "gpu" else "host memory",
                move.why, done)
    life.changes.changed()
