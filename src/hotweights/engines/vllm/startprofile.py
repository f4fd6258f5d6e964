"""Where a vLLM start's warm-up goes (``HOTWEIGHTS_PROFILE_START=1``, a diagnostic): the worker's
``compile_or_warm_up_model`` sampled, and the stacks that took its time logged.

On an H200 (vLLM 0.26, 8B) 15-21 s passed between vLLM's ``Graph capturing finished`` and its ``init engine``
line in the first start on a cold box and in the starts right after it, and 1-2 s in every later start
(``benchmarks/results/gpu_load/fill10_seven_2026-12-05.json``, ``post_capture_s``); vLLM logs nothing in between.
A profiler that traces every call would slow the compile it runs beside, so this one samples: a thread reads the
worker thread's stack every ``INTERVAL_S`` (``sys._current_frames``), and at the end the most frequent innermost
frames are logged, for the samples after graph capture (those after the last one inside ``capture_model``) and
for the whole warm-up: ``hotweights: vLLM's warm-up of <model>, sampled every 0.2 s: ...``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)
PROFILE_START_ENV = "HOTWEIGHTS_PROFILE_START"
INTERVAL_S = 0.2
DEPTH = 6  # innermost frames per stack
TOP = 8  # stacks logged per part


def wanted() -> bool:
    return os.environ.get(PROFILE_START_ENV) == "1"


def _frames(frame: FrameType | None) -> list[str]:
    out = []
    while frame is not None:
        code = frame.f_code
        out.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
        frame = frame.f_back
    return out


class Samples:
    """The stacks of thread ``ident``, one every ``interval`` s, until ``stop``."""

    def __init__(self, ident: int, interval: float = INTERVAL_S) -> None:
        self.ident, self.interval = ident, interval
        self.stacks: list[list[str]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hotweights-start-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.stacks.append(_frames(sys._current_frames().get(self.ident)))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def after(self, name: str) -> list[list[str]]:
        """The samples taken after the last one with ``name`` (a function) on its stack; all where none has."""
        last = max((i for i, s in enumerate(self.stacks) if any(f.endswith(f":{name}") for f in s)), default=-1)
        return self.stacks[last + 1:]

    def summary(self, stacks: list[list[str]]) -> str:
        counts = Counter(" < ".join(s[:DEPTH]) for s in stacks if s)
        return "\n".join(f"  {n * self.interval:6.1f} s  {stack}" for stack, n in counts.most_common(TOP))


def sampled(original: Callable[..., Any], worker: Any, name: str) -> Any:
    """``original(worker)`` (vLLM's ``compile_or_warm_up_model``), its stacks sampled and logged."""
    samples = Samples(threading.get_ident())
    began = time.perf_counter()
    try:
        return original(worker)
    finally:
        samples.stop()
        after = samples.after("capture_model")
        logger.info("hotweights: vLLM's warm-up of %s, sampled every %.1f s (%.1f s in all):\n"
                    "after graph capture, %.1f s:\n%s\nthe whole warm-up:\n%s", name, samples.interval,
                    time.perf_counter() - began, len(after) * samples.interval, samples.summary(after),
                    samples.summary(samples.stacks))
