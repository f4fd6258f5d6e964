"""The switch's choices, as functions of its models' state (so that they are tested without engines): which model a
switch serves next, which awake engine parks for it, and when a request is answered 503 without a switch.

``fair`` (the default): a model whose longest-waiting request has waited over ``starve_after_s`` goes next (the
longest first), else the one with the most requests waiting (then the longest-waiting); an idle engine parks
before a busy one (a busy one's requests in flight are waited for, up to ``overlap_after_s``: operations.py), then
the least recently used. ``fifo``: the request that came first, the least recently used.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .config import SwitchConfig
from .model import Model
from .states import ModelState


def next_model(models: Iterable[Model], config: SwitchConfig, default: Model) -> Model | None:
    """The model to start or switch to next: one requests wait for (by the schedule), else the next one start-up
    has not reached (``startup_order``), else one whose start failed and may be tried again, else None."""
    models = list(models)
    wanted = [m for m in models if m.waiting > m.reserved and not (m.state is ModelState.AWAKE and not m.draining)
              and not refusal(m)]
    if wanted:
        if config.schedule == "fifo":
            return max(wanted, key=lambda m: m.waited_s())
        starving = [m for m in wanted if m.waited_s() > config.starve_after_s]
        if starving:
            return max(starving, key=lambda m: m.waited_s())
        return max(wanted, key=lambda m: (m.waiting - m.reserved, m.waited_s()))
    left = [m for m in startup_order(models, default) if not m.started] or retried(models)
    return left[0] if left else None


def startup_order(models: Iterable[Model], default: Model) -> list[Model]:
    """The order start-up takes the models in: the default, then those whose parked weights go to host memory
    (``parked_weights = "host"``), then the rest, each group as configured. A host-tier engine's weights leave the
    GPU once it has started and parked, so its preload (which holds them on the GPU, twice at its peak) finds more
    room early than late, when every GPU-tier model's weights are there: ten 8B vLLM models, six of them on the GPU
    tier, fit an H200 in this order and not in the configured one (the seventh preload would need 34 GiB where
    30 are free)."""
    rest = [m for m in models if m is not default]
    return [default, *sorted(rest, key=lambda m: m.config.parked_weights != "host")]


def retried(models: list[Model]) -> list[Model]:
    """Models whose start failed and whose back-off is over (or whose files changed): start-up tries them again by
    itself, no request needed (a default that failed once would otherwise leave ``/health`` at 503 until a request
    came, and a health-gated deployment sends none)."""
    return [m for m in models if m.state is ModelState.FAILED and m.failure is not None and m.failure.kind == "start"
            and not m.waiting and not refusal(m)]


def pick_victim(candidates: list[Model], schedule: str) -> Model:
    """The awake engine to park for another."""
    if schedule == "fifo":
        return min(candidates, key=lambda x: x.last_used)
    return min(candidates, key=lambda x: (x.inflight > 0, x.last_used))


def refusal(m: Model) -> str:
    """Why a request for ``m`` is answered 503 now without a switch ("" when a switch may serve it): its start
    failed, the back-off has not passed and its checkpoint's files are as they were."""
    f = m.failure
    if m.state is not ModelState.FAILED or f is None or f.kind != "start":
        return ""
    left = f.retry_at - time.monotonic()
    if left <= 0 or m.engine.files() != f.files:
        return ""
    return f"{f.message} (tried again in {left:.0f} s, or at once when its checkpoint's files change)"
