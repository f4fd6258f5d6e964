"""A model behind the switch as the switcher keeps it (``Model``), and as ``/switch/status`` and ``hotweights switch
status`` show it (``ModelRow``, frozen). Torch-free."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from .config import ModelConfig
from .engines import EngineLike
from .gpus import host_mib
from .states import Failure, ModelState


@dataclass
class Model:
    config: ModelConfig
    engine: EngineLike
    state: ModelState = ModelState.STARTING
    started: bool = False  # start-up reached it (or a request did): its engine was started once
    inflight: int = 0
    waiting: int = 0
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each request waiting for it
    reserved: int = 0  # waiting requests a switch already counted in flight
    last_used: float = 0.0
    parked_at: float = 0.0
    wakes: int = 0
    attempts_failed: int = 0  # switches to it that failed: a request waiting across one is answered 503
    start_failures: int = 0  # starts that failed in a row: the back-off doubles with each
    failure: Failure | None = None
    cached: str = ""  # what its last preload said: "cached", or "not cached (why)": its engine reads the checkpoint
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    answered: deque[tuple[float, float | None]] = field(default_factory=lambda: deque(maxlen=1024))
    # (time.time(), its first byte's seconds from arrival or None) of each request relayed: the rate and TTFT shown

    def relayed(self, first_byte_s: float | None) -> None:
        self.answered.append((time.time(), first_byte_s))

    def pace(self, window_s: float = 60.0) -> tuple[int, float | None]:
        """Requests relayed in the last ``window_s`` seconds, and the median of their times to first byte."""
        since = time.time() - window_s
        recent = [first for at, first in self.answered if at >= since]
        firsts = [f for f in recent if f is not None]
        return len(recent), (statistics.median(firsts) if firsts else None)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def error(self) -> str:
        return self.failure.message if self.failure is not None else ""

    def waited_s(self, now: float | None = None) -> float:
        """How long its longest-waiting request has waited."""
        return (now or time.monotonic()) - min(self.arrivals) if self.arrivals else 0.0

    def row(self, gpu: dict[int, int]) -> ModelRow:
        pids = self.engine.pids()
        held = sum(gpu.get(p, 0) for p in pids) if gpu and pids else None
        requests, first = self.pace()
        return ModelRow(self.name, self.config.engine, self.state.value, self.engine.pid,
                        self.engine.server or self.engine.pid, held,
                        list(self.config.gpus) or None, self.engine.port, self.inflight, self.waiting,
                        self.last_used or None, self.wakes, self.engine.parks, self.error or None,
                        str(self.engine.log_path), host_mib(pids) if pids else None, self.config.parked_weights,
                        self.config.start, list(self.config.aliases), requests, first, self.cached or None)


@dataclass(frozen=True, slots=True)
class Switched:
    """A switch, for ``/switch/status`` and the status page: when (``time.time()``), how long from taking the lock to
    awake, where its weights came from, how long its first request had waited, which engines parked for it."""

    at: float
    model: str
    seconds: float
    source: str
    waited_s: float
    parked: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelRow:
    name: str
    engine: str
    state: str
    pid: int  # the engine's process (for vLLM: its launcher)
    server_pid: int  # the process that serves (a warm standby's child, else ``pid``)
    gpu_mib: int | None  # what its processes hold on the GPU (nvidia-smi), None where it cannot be read
    gpus: list[int] | None
    port: int
    inflight: int
    waiting: int
    last_used: float | None
    wakes: int
    parks: bool
    error: str | None  # one line
    log: str
    host_mib: int | None = None  # its processes' resident host memory (a deep park's weights and staging included)
    parked_weights: str = "gpu"  # where its weights stay while it is parked: "gpu" or "host"
    start: str = "eager"
    aliases: list[str] | None = None
    requests_1m: int = 0  # requests relayed to it in the last minute
    ttft_p50_s: float | None = None  # their median time to first byte, the wait for a switch included
    cached: str | None = None  # its last preload's account: "cached", or "not cached (why)" (served from disk)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ModelRow:
        return cls(**{k: row.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]  # a status row
