"""Start-up's preloads run ahead of the starts, several at a time where GPU memory allows (``preload_jobs``).

A vLLM preload is a whole vLLM start (90-100 s for an 8B on an H200), so ten models preloaded one after another
take a quarter of an hour before the last is up. Here each model's preload begins as soon as it is admitted, in
start-up order (a model a request or a start waits for first), while the engines start: a start awaits its own
preload; one that profiles the GPU's memory (``GpuNeed.profiles``: vLLM sizes its KV cache from a profile of the
whole GPU's memory, which a preload allocating meanwhile corrupts; a vLLM preload pins its own KV cache for that
reason, ``engines/vllm/kvpin.py``) starts with no preload beside it on its GPUs (``alone``), and one whose KV cache
its arguments pin starts beside them (the memory its start needs is reserved: ``schedule.preload_fits``).

A preload does not begin on GPUs where a model whose preload is done and whose start profiles has yet to start
(unless a start waits for it): the starts go first, then the next preloads begin together, a wave (as memory
admits), rather than one by one between starts, each holding the next start back.

Which preload begins, and when, is ``schedule.next_preload``'s decision (a pure function, tested as a table), over
a snapshot taken right after free memory is read (``nvidia-smi``), so nothing changes between the read and the
decision; this loop only runs the jobs. It looks again when a preload ends, a start waits for one or ends, and
every ``LOOK_AGAIN_S`` (free memory changes as engines start and park, which nothing signals). A preload that failed
while others ran is tried again alone, once. Where nothing tells free memory (no GPU), only ``preload_jobs`` bounds
them.

Two things run beside the preloads from the start: the compile ahead of the front's first start
(``begin_compile_ahead``: its preload's time no longer precedes its compile), and one thread reading the next
preloads' checkpoints into the page cache (``readahead.py``: the disk no longer idles while a preload imports vLLM
or waits for memory). Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

from .gpus import GpuMemory, gpu_memory
from .memory import RESERVE_MIB, GpuNeed
from .model import Model
from .readahead import ReadAhead, shard_paths
from .schedule import Preloading, next_preload, queued_preloads
from .snapshot import Snapshot, View
from .states import PreloadOutcome

logger = logging.getLogger("hotweights.switch")
LOOK_AGAIN_S = 1.0  # free memory changes as engines start and park: admission looks again this often


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


class Preloads:
    """The preloads of ``models`` (in start-up order: the default first), up to ``jobs`` at a time, decided over the
    switch's snapshot (``look``: ``Lifecycle.snapshot``); ``reserve_for``: the starts they leave room for in it
    (``schedule.start_to_reserve_for``)."""

    def __init__(self, models: list[Model], jobs: int, look: Callable[[], Snapshot],
                 reserve_for: Callable[[Snapshot], Sequence[View]],
                 memory: Callable[[], dict[int, GpuMemory]] | None = None, compile_ahead: bool = False,
                 read_ahead: bool = True) -> None:
        self.models, self.jobs, self.reserve_for, self.compile_ahead = models, jobs, reserve_for, compile_ahead
        self.look = look
        self.read_ahead = read_ahead
        self.ended: set[str] = set()  # models whose preload has ended (read by the read-ahead's thread too)
        self.reading: asyncio.Task[None] | None = None  # the read-ahead (``_reader``)
        self.memory = memory or gpu_memory
        self.done: dict[str, asyncio.Future[tuple[PreloadOutcome, float]]] = {}
        self.running: dict[str, Job] = {}
        self.failed_beside: set[str] = set()  # failed beside others: tried again with none running
        self.copying: set[str] = set()  # preloaded, their host copy being made: out of the queue, no memory held
        self.wanted: list[str] = []  # a start waits for these
        self.starting: dict[str, GpuNeed] = {}  # engines that profile starting, or waiting to: no preload there
        self.ahead: dict[str, asyncio.Task[None]] = {}  # a compile ahead of a start (``begin_compile_ahead``)
        self.compiled_ahead: set[str] = set()  # those that ended with the code compiled
        self.compiling: dict[str, GpuNeed] = {}  # those running, for the admission of preloads beside them
        self._look = asyncio.Event()

    def look_again(self) -> None:
        """Something the admission reads changed (an engine's GPU need, as its arguments did): it looks again."""
        self._look.set()

    async def result(self, m: Model) -> tuple[PreloadOutcome, float]:
        """``m``'s preload (what happened, its seconds), once done; a start that waits for it moves it first."""
        future = self.done.setdefault(m.name, asyncio.get_running_loop().create_future())
        if not future.done() and m.name not in self.running:
            self.wanted.append(m.name)
            self._look.set()
        return await asyncio.shield(future)

    def peaks_mib(self, totals: dict[int, int]) -> dict[int, int]:
        """What the preloads running hold on each GPU (of ``totals``' MiB) at their peaks, counted whole."""
        return {g: sum(job.need.preload_mib(total) for job in self.running.values() if g in job.need.gpus)
                for g, total in totals.items()}

    def preloaded(self, m: Model) -> bool:
        """Whether ``m``'s preload is done (or it has none here): its start waits for nothing."""
        future = self.done.get(m.name)
        return m not in self.models or (future is not None and future.done())

    @contextlib.asynccontextmanager
    async def alone(self, m: Model) -> AsyncGenerator[None, None]:
        """``m``'s engine starts with no preload beside it on its GPUs where its start profiles the GPU's memory:
        vLLM sizes its KV cache from a profile of the whole GPU's memory, which a preload allocating meanwhile would
        shrink (or leave none). The preloads running there end first, and none begins there until it is done. A
        start whose KV cache its arguments pin goes at once."""
        need = m.engine.gpu_need()
        if not need.profiles:
            yield
            return
        self.starting[m.name] = need
        try:
            while any(set(job.need.gpus) & set(need.gpus) for job in self.running.values()):
                self._look.clear()
                await self._look.wait()
            yield
        finally:
            del self.starting[m.name]
            self._look.set()

    async def compiled(self, m: Model) -> float:
        """Once every compile ahead has ended (at once where none runs): ``m``'s start waits for them, as one begun
        before it ended would compile the same code again. The seconds waited."""
        began = time.monotonic()
        for task in list(self.ahead.values()):
            await asyncio.shield(task)
        return time.monotonic() - began

    def first_start_compiles(self) -> bool:
        """Whether the front's first start compiles its engine's code itself (no compile ahead runs, or it failed):
        then no start joins it (``Switcher._joining``), as each would compile too."""
        return not any(name in self.compiling or name in self.compiled_ahead for name in self.ahead)

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
        if first is not None and self.compile_ahead and not self.preloaded(first):
            self.ahead[first.name] = asyncio.create_task(self._compile_ahead(first))

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
        self.compiling[m.name] = need
        try:
            seconds = await asyncio.to_thread(m.engine.compile_ahead, total)
        except Exception as exc:  # its start compiles itself: never the end of start-up
            logger.warning("switch: %s: its compile ahead failed (%s); its start compiles", m.name, exc)
            return
        finally:
            self.compiling.pop(m.name, None)
            self._look.set()
        if seconds is not None:
            self.compiled_ahead.add(m.name)
            logger.info("switch: %s: compiled ahead of its start in %.1f s (its start loads the compiled code)",
                        m.name, seconds)

    async def run(self) -> None:
        """Begin preloads as ``next_preload`` admits them until every model's is done (a task of the switcher;
        cancelled with it), and the first start's compile beside them (``begin_compile_ahead``)."""
        await self._already()
        self.begin_compile_ahead()
        reader = self._reader()
        tasks: set[asyncio.Task[None]] = set()
        if reader is not None:  # a thread: it blocks on the disk; ends by itself, or stopped below
            self.reading = asyncio.create_task(asyncio.to_thread(reader.run))
        try:
            while (queued := queued_preloads(self._views(self.look()), self.preloading())) or self.running:
                # one that failed beside others comes back to the queue
                memory = await asyncio.to_thread(self.memory) if queued and queued[0].need.gpus else {}
                s = self.look()  # no await from here to the decision
                v = next_preload(self._views(s), self.preloading(), memory, self.reserve_for(s))
                if v is not None:
                    m = next(x for x in self.models if x.name == v.name)
                    self.running[m.name] = Job(v.need)
                    for job in self.running.values():
                        job.beside |= len(self.running) > 1
                    task = asyncio.create_task(self._preload(m))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    continue
                self._look.clear()
                try:
                    await asyncio.wait_for(self._look.wait(), LOOK_AGAIN_S)
                except TimeoutError:
                    pass
            await asyncio.gather(*tasks, *self.ahead.values())
        finally:
            if reader is not None:
                reader.stop.set()
            for task in (*tasks, *self.ahead.values()):
                task.cancel()

    def _reader(self) -> ReadAhead | None:
        """The read-ahead of the checkpoints whose preloads run a process (``readahead.py``), None where it is off."""
        left = {m.name: m for m in self.models if not self.preloaded(m)}
        if not self.read_ahead or not left:
            return None
        return ReadAhead(list(left), lambda name: shard_paths(left[name].config.checkpoint),
                         lambda name: name in self.ended)

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
            if said is not None:
                self._finish(m, said, time.monotonic() - began)

        await asyncio.gather(*(ask(m) for m in self.models))
        self._look.set()

    def _finish(self, m: Model, said: PreloadOutcome, seconds: float) -> None:
        """``m``'s preload is done: what it did and its seconds, for its start (``result``)."""
        self.done.setdefault(m.name, asyncio.get_running_loop().create_future())
        self.ended.add(m.name)
        if not self.done[m.name].done():
            self.done[m.name].set_result((said, seconds))

    def _views(self, s: Snapshot) -> list[View]:
        """Its models as ``s`` sees them, in start-up order."""
        return [s[m.name] for m in self.models]

    def preloading(self) -> Preloading:
        """The preloads now, as ``next_preload`` reads them."""
        return Preloading(self.jobs, {n: job.need for n, job in self.running.items()},
                          frozenset(n for n, f in self.done.items() if f.done()), tuple(self.wanted),
                          tuple(self.starting.values()), frozenset(self.failed_beside), frozenset(self.copying),
                          dict(self.compiling))

    async def _preload(self, m: Model) -> None:
        job = self.running[m.name]
        beside = len(self.running) - 1
        logger.info("switch: %s: preloading%s", m.name, f" beside {beside} other preload(s)" if beside else "")

        def ended() -> None:
            if self.running.pop(m.name, None) is not None:
                self.copying.add(m.name)
                self._look.set()

        try:
            said = await preload_then_copy(m, ended)
        except Exception as exc:  # a preload that broke is a start without a cache, not a dead front
            said = PreloadOutcome("failed", f"{type(exc).__name__}: {exc}")
        finally:
            ended()
            self.copying.discard(m.name)
        seconds = time.monotonic() - job.began
        if said.failed and job.beside and m.name not in self.failed_beside:
            logger.warning("switch: %s: its preload failed beside others (%s); trying again alone", m.name, said)
            self.failed_beside.add(m.name)
            return
        self._finish(m, said, seconds)
