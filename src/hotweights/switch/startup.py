"""Start-up: every model's preload and start, as two state machines beside its ``ModelState`` (``states.py``:
``PreloadState`` and ``StartState``, each with one table and one door here, ``preload_moves`` and ``start_moves``),
and one object, ``Startup``, that runs their jobs.

A vLLM preload is a whole vLLM start (90-100 s for an 8B on an H200), so ten models preloaded one after another
take a quarter of an hour before the last is up. Where preloads run ahead of the starts (``preload_jobs`` > 1:
``ahead``), each model's preload (not a lazy one's) begins as soon as it is admitted, in start-up order (a model a
request or a start waits for first), while the engines start; elsewhere (no GPU, or one job) a preload begins when
its start waits for it, which is each start preloading its own model. A start awaits its own preload; one that
profiles the GPU's memory (``GpuNeed.profiles``: vLLM sizes its KV cache from a profile of the whole GPU's memory,
which a preload allocating meanwhile corrupts; a vLLM preload pins its own KV cache for that reason,
``engines/vllm/kvpin.py``) starts with no preload beside it on its GPUs (``alone``), and one whose KV cache its
arguments pin starts beside them (the memory its start needs is reserved: ``admit.preload_fits``).

Which preload begins, and when, is ``admit.next_preload``'s decision (a pure function, tested as a table), over
the switch's snapshot taken right after free memory is read (``nvidia-smi``), so nothing changes between the read
and the decision; this object only runs the jobs. It looks again on every change (``Changes``, the scheduler's
signal). One task (``sample``) is the only poll: while start-up goes on it reads the starts' logs every
``SAMPLE_S`` (a start's move to ``COMPILED`` or ``PROFILED``) and GPU memory every ``MEMORY_EVERY`` of them where a
preload waits for it (free memory changes as engines start and park, which nothing signals), and signals a change
when either moved. A preload that failed while others ran is tried again alone, once.

Two things run beside the preloads from the start where they run ahead: the compile ahead of the front's first
start (``begin_compile_ahead``: its preload's time no longer precedes its compile), and one thread reading the next
preloads' checkpoints into the page cache (``readahead.py``: the disk no longer idles while a preload imports vLLM
or waits for memory). Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .gpus import GpuMemory, gpu_memory
from .memory import RESERVE_MIB, GpuNeed
from .model import Changes, Model
from .readahead import ReadAhead, shard_paths
from .admit import next_preload, preload_queue, preloading, queued_preloads
from .snapshot import Snapshot, View
from .states import (PRELOAD_MOVES, SERVING, START_MOVES, STARTS_GOING_ON, InvalidTransition, PreloadOutcome,
                     PreloadState, StartState)

P, T = PreloadState, StartState
logger = logging.getLogger("hotweights.switch")
SAMPLE_S = 0.25  # while start-up goes on, its starts' logs are read this often
MEMORY_EVERY = 4  # and GPU memory every this many samples, where a preload waits for room


async def preload_then_copy(m: Model, ended: Callable[[], None] = lambda: None) -> PreloadOutcome:
    """``m``'s preload, then (where its process ran) the host copy of a host-tier model's weights. ``ended`` is
    called in between: the copy holds none of the GPU memory the preload was admitted for, and held inside the
    preload's job it kept the next preloads out 17.5-18.3 s per host-tier model (H200, ten 8B)."""
    said = await asyncio.to_thread(m.engine.preload)
    ended()
    if said.kind == "cached":  # "already": its bookkeeping, the host copy among it, is done (``cached_already``)
        note = await asyncio.to_thread(m.engine.host_copy_after)
        said = PreloadOutcome("cached", note) if note else said
    return said


@dataclass
class Job:
    need: GpuNeed
    began: float = field(default_factory=time.monotonic)
    beside: bool = False  # another preload ran during it
    alone: bool = False  # begun again alone, after it failed beside others


class Startup:
    """The preloads and starts of ``models`` (in start-up order: the default first), up to ``jobs`` preloads at a
    time, ahead of the starts where ``ahead``; decided over the switch's snapshot (``look``: ``Lifecycle.snapshot``),
    leaving room for the starts ``reserve_for`` names in it (``admit.start_to_reserve_for``); ``changes``: the
    signal it waits on and gives; ``profiled``: called once a start's profile of the GPU's memory is done
    (``Lifecycle.pin_kv_as``)."""

    def __init__(self, models: list[Model], jobs: int, ahead: bool, look: Callable[[], Snapshot],
                 reserve_for: Callable[[Snapshot], Sequence[View]], changes: Changes,
                 profiled: Callable[[Model], None] = lambda m: None,
                 memory: Callable[[], dict[int, GpuMemory]] | None = None, compile_ahead: bool = False,
                 read_ahead: bool = True) -> None:
        self.models, self.jobs, self.ahead = models, max(1, jobs), ahead
        self.look, self.reserve_for, self.changes, self.profiled = look, reserve_for, changes, profiled
        self.memory = memory or gpu_memory
        self.compile_ahead, self.read_ahead = compile_ahead and ahead, read_ahead and ahead
        self.running: dict[str, Job] = {}  # the jobs of preloads RUNNING or COPYING
        self.ahead_task: asyncio.Task[None] | None = None  # the compile ahead (``begin_compile_ahead``)
        self.ahead_state = ""  # "", "compiling", "compiled", "failed"
        self.ahead_need: GpuNeed | None = None
        self.reading: asyncio.Task[None] | None = None  # the read-ahead (``_reader``)

    # the two doors
    def preload_moves(self, m: Model, to: PreloadState) -> None:
        """The one way a model's preload changes state (``PRELOAD_MOVES``)."""
        if to not in PRELOAD_MOVES[m.preload]:
            logger.error("switch: %s: refused preload move %s -> %s", m.name, m.preload, to)
            raise InvalidTransition(f"{m.name}'s preload: {m.preload} -> {to} is not a move of start-up")
        m.preload = to
        self.changes.changed()

    def start_moves(self, m: Model, to: StartState) -> None:
        """The one way a model's start changes state (``START_MOVES``); a start whose profile is done has the models
        that would start as it did take the KV cache it gave (``profiled``), and the front's first start that
        compiled its code says so (starts may join it from now on)."""
        if to not in START_MOVES[m.start_phase]:
            logger.error("switch: %s: refused start move %s -> %s", m.name, m.start_phase, to)
            raise InvalidTransition(f"{m.name}'s start: {m.start_phase} -> {to} is not a move of start-up")
        m.start_phase = to
        if to is T.COMPILED and not any(x.state in SERVING or x.start_phase in (T.COMPILED, T.PROFILED, T.UP)
                                        for x in self.models if x is not m):
            logger.info("switch: %s's start has compiled its engine's code (its log says so): the starts whose "
                        "preloads are done may join it now", m.name)
        if to is T.PROFILED:
            self.profiled(m)
        self.changes.changed()

    def forget(self, m: Model) -> None:
        """``m``'s configuration changed (a reload): its preload and start go back to the beginning, through the
        doors, as a model's that start-up has not reached."""
        if m.preload is P.DONE:
            self.preload_moves(m, P.QUEUED)
        m.preloaded, m.awaited = None, False
        if m.start_phase is not T.WAITING:
            self.start_moves(m, T.WAITING)

    # what the snapshot reads
    def needs(self) -> tuple[dict[str, GpuNeed], dict[str, GpuNeed]]:
        """The needs of the preloads running and of the compile ahead running, by model."""
        running = {n: job.need for n, job in self.running.items() if self._model(n).preload is P.RUNNING}
        compiling = {self.models[0].name: self.ahead_need} if self.ahead_state == "compiling" and self.ahead_need \
            else {}
        return running, compiling

    def first_start_compiles(self) -> bool:
        """Whether the front's first start compiles its engine's code itself (no compile ahead runs, or it failed):
        then no start joins it (``schedule.may_join``), as each would compile too."""
        return self.ahead_state not in ("compiling", "compiled")

    # what a start awaits
    async def result(self, m: Model) -> tuple[PreloadOutcome, float]:
        """``m``'s preload (what happened, its seconds), once done; a start that waits for it moves it first."""
        if m.preload is not P.DONE and not m.awaited:
            m.awaited = True
            self.changes.changed()
        while m.preload is not P.DONE:
            await self.changes.wait()
        assert m.preloaded is not None
        return m.preloaded

    async def alone(self, m: Model) -> None:
        """``m``'s engine starts now (``StartState.STARTING``); where its start profiles the GPU's memory, once no
        preload runs on its GPUs: vLLM sizes its KV cache from a profile of the whole GPU's memory, which a preload
        allocating meanwhile would shrink (or leave none). The preloads running there end first, and none begins
        there until it is up (``admit.preloading``: ``starting``). A start whose KV cache its arguments pin goes
        at once."""
        self.start_moves(m, T.STARTING)
        need = m.engine.gpu_need()
        while need.profiles and any(set(job.need.gpus) & set(need.gpus) for n, job in self.running.items()
                                    if self._model(n).preload is P.RUNNING):
            await self.changes.wait()

    async def compiled(self, m: Model) -> float:
        """Once the compile ahead has ended (at once where none runs): ``m``'s start waits for it, as one begun
        before it ended would compile the same code again. The seconds waited."""
        began = time.monotonic()
        if self.ahead_task is not None:
            await asyncio.shield(self.ahead_task)
        return time.monotonic() - began

    # the jobs
    def begin_compile_ahead(self) -> None:
        """The front's first start (the first model of start-up's order) compiles beside its preload where that
        preload runs a process: a server of its own with random weights (``Engine.compile_ahead``) compiles what the
        start would, and the start, once both have ended, loads the compiled code. On an H200 (vLLM 0.26, 8B, empty
        caches) the default's preload took 48.8 s alone and its start 62.7 s after it, 36.1 s of it torch.compile
        and 16.4 s its sampler's Triton kernels: every start after it loads what it compiled (models of one config
        share vLLM's compile cache, ``compile_key.py``). Not where the keeper holds the model already (its start is
        next, nothing to compile beside), where its GPU's free memory does not hold both beside each other (the
        preload at its peak, ``GpuNeed.ahead_mib``), or with ``compile_ahead = false``."""
        first = self.models[0] if self.models else None
        if first is not None and self.compile_ahead and first.preload is not P.DONE:
            self.ahead_task = asyncio.create_task(self._compile_ahead(first))

    async def _compile_ahead(self, m: Model) -> None:
        need = m.engine.gpu_need()
        memory = await asyncio.to_thread(self.memory) if need.gpus else {}
        gpu = memory.get(need.gpus[0]) if need.gpus else None
        if gpu is not None and gpu.free_mib - need.preload_mib(gpu.total_mib) - need.ahead_mib < RESERVE_MIB:
            logger.info("switch: %s: not compiled ahead: %d MiB of its GPU free, its preload takes %d MiB at its "
                        "peak and the compile %d MiB beside it", m.name, gpu.free_mib,
                        need.preload_mib(gpu.total_mib), need.ahead_mib)
            return
        total = gpu.total_mib if gpu is not None else 0
        if not await asyncio.to_thread(m.engine.compiles_ahead, total):
            return
        self.ahead_state, self.ahead_need = "compiling", need
        try:
            seconds = await asyncio.to_thread(m.engine.compile_ahead, total)
        except Exception as exc:  # its start compiles itself: never the end of start-up
            logger.warning("switch: %s: its compile ahead failed (%s); its start compiles", m.name, exc)
            self.ahead_state = "failed"
            return
        finally:
            if self.ahead_state == "compiling":  # cancelled, or no compile to run after all
                self.ahead_state = ""
            self.changes.changed()
        if seconds is not None:
            self.ahead_state = "compiled"
            logger.info("switch: %s: compiled ahead of its start in %.1f s (its start loads the compiled code)",
                        m.name, seconds)

    async def run(self) -> None:
        """Begin preloads as ``next_preload`` admits them, for as long as the front runs (a task of the switcher,
        cancelled with it), with the first start's compile and the read-ahead beside them where they run ahead,
        and the one sampling task (``sample``)."""
        if self.ahead:
            await self._already()
        self.begin_compile_ahead()
        reader = self._reader()
        tasks: set[asyncio.Task[None]] = set()
        if reader is not None:  # a thread: it blocks on the disk; ends by itself, or stopped below
            self.reading = asyncio.create_task(asyncio.to_thread(reader.run))
        sampling = asyncio.create_task(self.sample())
        try:
            while True:
                s = self.look()
                queued = queued_preloads(preload_queue(s), preloading(s))
                if queued:
                    memory = await asyncio.to_thread(self.memory) if queued[0].need.gpus else {}
                    s = self.look()  # no await from here to the decision, and the move to RUNNING
                    v = next_preload(preload_queue(s), preloading(s), memory, self.reserve_for(s))
                    if v is not None:
                        task = asyncio.create_task(self._preload(self._begin(self._model(v.name), v.need)))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        continue
                await self.changes.wait()
        finally:
            if reader is not None:
                reader.stop.set()
            for task in (*tasks, sampling, *([self.ahead_task] if self.ahead_task else [])):
                task.cancel()

    async def sample(self) -> None:
        """The only poll: while a start goes on, its log every ``SAMPLE_S`` (moving it to ``COMPILED`` or
        ``PROFILED``); while a preload waits for room, GPU memory every ``MEMORY_EVERY`` samples. A change is
        signalled when one moved. Between start-ups it waits for a change."""
        free: dict[int, int] = {}
        tick = 0
        while True:
            starting = [m for m in self.models if m.start_phase in STARTS_GOING_ON]
            waiting = self.ahead and any(m.preload in (P.QUEUED, P.RETRY_ALONE) and m.engine.gpu_need().gpus
                                         for m in self.models if m.awaited or m.config.start != "lazy")
            if not starting and not waiting:
                await self.changes.wait()
                continue
            for m in starting:
                self._read_start(m)
            if waiting and tick % MEMORY_EVERY == 0:
                now = {g: mem.free_mib for g, mem in (await asyncio.to_thread(self.memory)).items()}
                if now != free:
                    free = now
                    self.changes.changed()
            tick += 1
            await asyncio.sleep(SAMPLE_S)

    def _read_start(self, m: Model) -> None:
        """What ``m``'s start has said in its log since it began: its code compiled, its profile done."""
        if m.start_phase is T.STARTING and m.engine.compiled():
            self.start_moves(m, T.COMPILED)
        if (m.start_phase in (T.STARTING, T.COMPILED) and m.engine.gpu_need().profiles
                and m.engine.profiled()):
            self.start_moves(m, T.PROFILED)

    def _reader(self) -> ReadAhead | None:
        """The read-ahead of the checkpoints whose preloads run a process (``readahead.py``), None where it is off."""
        left = {m.name: m for m in self.models if m.preload is not P.DONE and m.config.start != "lazy"}
        if not self.read_ahead or not left:
            return None
        return ReadAhead(list(left), lambda name: shard_paths(left[name].config.checkpoint),
                         lambda name: left[name].preload is P.DONE)

    async def _already(self) -> None:
        """The models whose preload runs no process (the keeper holds them already, or their engine reads its
        checkpoint itself): done at once, all asked together (a host copy still to make takes seconds), with no GPU
        memory admitted for a preload they do not run. A front started again on a full keeper otherwise ran them one
        by one behind the starts, each waiting for room for a whole preload (H200, ten 8B: no start went beside
        another)."""
        async def ask(m: Model) -> None:
            began = time.monotonic()
            try:
                said = await asyncio.to_thread(m.engine.cached_already)
            except Exception as exc:  # its preload says what is wrong
                logger.warning("switch: %s: cannot tell whether the keeper holds it: %s", m.name, exc)
                return
            if said is not None and m.preload is P.QUEUED:
                self._finish(m, said, time.monotonic() - began)

        await asyncio.gather(*(ask(m) for m in self.models if m.config.start != "lazy"))

    def _finish(self, m: Model, said: PreloadOutcome, seconds: float) -> None:
        """``m``'s preload is done: what it did and its seconds, for its start (``result``)."""
        m.preloaded = (said, seconds)
        self.preload_moves(m, P.DONE)

    def _model(self, name: str) -> Model:
        return next(m for m in self.models if m.name == name)

    def _begin(self, m: Model, need: GpuNeed) -> Model:
        """``m``'s preload begins (``RUNNING``), its job counted beside those running."""
        self.running[m.name] = Job(need, alone=m.preload is P.RETRY_ALONE)
        self.preload_moves(m, P.RUNNING)
        running = [job for n, job in self.running.items() if self._model(n).preload is P.RUNNING]
        for job in running:
            job.beside |= len(running) > 1
        beside = len(running) - 1
        logger.info("switch: %s: preloading%s", m.name, f" beside {beside} other preload(s)" if beside else "")
        return m

    async def _preload(self, m: Model) -> None:
        job = self.running[m.name]

        def ended() -> None:
            if m.preload is P.RUNNING:
                self.preload_moves(m, P.COPYING)

        try:
            said = await preload_then_copy(m, ended)
        except Exception as exc:  # a preload that broke is a start without a cache, not a dead front
            said = PreloadOutcome("failed", f"{type(exc).__name__}: {exc}")
        finally:
            ended()
            del self.running[m.name]
        seconds = time.monotonic() - job.began
        if said.failed and job.beside and not job.alone:
            logger.warning("switch: %s: its preload failed beside others (%s); trying again alone", m.name, said)
            self.preload_moves(m, P.RETRY_ALONE)
            return
        self._finish(m, said, seconds)
