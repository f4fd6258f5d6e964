"""The front's bookkeeping of the answers it relays: each request's line in the log (``Said``), and the stop of every
open stream when the front is asked to stop (``Stopping``). Torch-free."""

from __future__ import annotations

import asyncio
import re
import time

from .admission import Admission


class Said:
    """One relayed request, for its line in the front's log: ``switch: request a /v1/completions 200, waited 0.012 s,
    first byte 0.054 s, 1.532 s in all, 37 tokens`` (the tokens where the engine's answer ends with its usage)."""

    TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')

    def __init__(self, name: str, path: str, code: int, arrived: float, waited: float) -> None:
        self.name, self.path, self.code, self.arrived, self.waited = name, path, code, arrived, waited
        self.first = 0.0
        self.end = b""  # the answer's last bytes: its usage, where it has one

    def seen(self, chunk: bytes) -> None:
        if not self.first:
            self.first = time.monotonic()
        self.end = (self.end + chunk)[-4096:]

    def line(self) -> str:
        tokens = self.TOKENS.findall(self.end)
        return (f"switch: request {self.name} {self.path} {self.code}, waited {self.waited:.3f} s"
                + (f", first byte {self.first - self.arrived:.3f} s" if self.first else "")
                + f", {time.monotonic() - self.arrived:.3f} s in all"
                + (f", {int(tokens[-1])} tokens" if tokens else ""))


class Stopping:
    """SIGINT/SIGTERM with requests open: uvicorn waits for every open connection before the front stops its engines,
    and a stream can last minutes. So the signal ends each stream now with vLLM's error event and ``[DONE]``, and
    answers each request still waiting for its model 503; then the front stops within seconds."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.halt: asyncio.Future[None] | None = None
        self.requests: Admission | None = None
        self.streams = 0  # ended by it
        self.waiting = 0  # answered 503 by it

    def begin(self, requests: Admission) -> None:
        """In the front's loop, as it starts."""
        self.loop, self.requests = asyncio.get_running_loop(), requests
        self.halt = self.loop.create_future()

    def halted(self) -> asyncio.Future[None]:
        assert self.halt is not None, "the front's lifespan begins it"
        return self.halt

    def signal(self) -> None:
        """From the signal handler: the rest runs in the front's loop."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        if self.halt is not None and not self.halt.done():
            self.halt.set_result(None)
            if self.requests is not None:
                self.waiting = self.requests.close()
