"""An engine that failed, and when the switch tries it again: whether its process has ended (``gone``), and the
failure a model records with its back-off (``start_failed``, ``died``): a start that failed after 30 s, then 60,
... up to 10 min (by the scheduler itself, or a request), or at once when the checkpoint's files change; an engine
that died while it served started again by its next request, or (the default model's, a kept-awake one's) by the
scheduler at once, and after the same back-off where it crashes again within ``STABLE_S`` of its start (a crash
loop must not spin the GPU). ``lifecycle.py`` records the failure and arms the retry. Torch-free."""

from __future__ import annotations

import asyncio
import time

from .model import Model
from .states import Failure, FailureKind

BACKOFF_S, BACKOFF_MAX_S = 30.0, 600.0
STABLE_S = 60.0  # an engine up this long before it died did not crash in a loop: its next crash restarts at once


async def gone(m: Model, wait_s: float = 10.0) -> bool:
    """Whether ``m``'s engine process has ended, waiting up to ``wait_s`` for it: asked where its connection failed
    (its process may take a moment to end after its socket closed: a GPU engine's teardown takes seconds)."""
    deadline = time.monotonic() + wait_s
    while m.engine.alive():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def start_failed(m: Model, message: str, now: float) -> tuple[Failure, float]:
    """The failure of ``m``'s start (its ``start_failures`` counted already), and the seconds until it is tried
    again."""
    backoff = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (m.start_failures - 1))
    return Failure(FailureKind.START, message, now + backoff, m.engine.files()), backoff


def died(m: Model, itself: bool, now: float) -> tuple[Failure, float]:
    """The failure of ``m``'s engine, dead while it served (its ``crashes`` counted already), and the seconds until
    the scheduler starts it again where it does so ``itself`` (0: at once, or on the next request)."""
    backoff = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (m.crashes - 2)) if itself and m.crashes > 1 else 0.0
    when = ("it starts again on the next request" if not itself else "it starts again now" if not backoff
            else f"it starts again in {backoff:.0f} s ({m.crashes} crashes, each within {STABLE_S:.0f} s of "
                 f"its start), or on the next request")
    return Failure(FailureKind.DIED, f"its engine exited (code {m.engine.exit_code}); {when}", now + backoff), backoff


def crashes(m: Model, now: float) -> int:
    """``m``'s crashes in a row with the one now: counted on where its engine was up under ``STABLE_S``."""
    return m.crashes + 1 if m.up_since and now - m.up_since < STABLE_S else 1
