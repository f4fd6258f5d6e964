"""One model's engine behind ``hotweights switch``: its kind (``kinds.py``: the commands), its process
(``process.py``: start, ask, stop) and its entries in the keeper (``keeper.py``), put together for the switcher,
which takes any object of this shape (``EngineLike``; the fast tests give it a fake). Blocking calls: the
switcher runs them on worker threads. Torch-free.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ... import evidence
from ...errors import HotweightsError
from ...evidence import size_text
from ...standby.handoff import PLACES_ENV
from ...unix import DIE_WITH_ENV
from ..config import ModelConfig
from ..gpus import gpu_mib_by_pid
from .keeper import KeeperView
from ..kinds import KINDS
from ..memory import GpuNeed
from .parking import park_asks, wake_asks
from .process import EngineError, EngineProcess, WakeRefused, one_line
from ..states import PreloadOutcome, WakeSource

# a wake takes 0.05-1 s on an H200 (from the GPU or host memory); one that does not answer within this is an engine
# that cannot (a dead server's orphan holding its port waited out 300 s before)
WAKE_TIMEOUT_S = 60.0

logger = logging.getLogger("hotweights.switch")
__all__ = ["Engine", "EngineError", "EngineLike", "WakeRefused", "gpu_mib_by_pid"]


class EngineLike(Protocol):
    """What the switcher asks of a model's engine."""

    parks: bool  # False: a park stops it, a wake starts it again
    log_path: Path
    model: ModelConfig

    @property
    def url(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def port(self) -> int: ...
    @property
    def server(self) -> int: ...
    @property
    def exit_code(self) -> int | None: ...
    def pids(self) -> list[int]: ...
    def alive(self) -> bool: ...
    @property
    def keeps_kv(self) -> bool: ...
    @property
    def kv_to_host(self) -> bool: ...
    def preload(self) -> PreloadOutcome: ...
    def host_copy_after(self) -> str: ...
    def cached_already(self) -> PreloadOutcome | None: ...
    def compiles_ahead(self, total_mib: int) -> bool: ...
    def compile_ahead(self, total_mib: int) -> float | None: ...
    def pin_kv_as(self, other: EngineLike) -> int: ...
    def start_output(self) -> str: ...
    def compiled(self) -> bool: ...
    def profiled(self) -> bool: ...
    def start(self) -> float: ...
    def park(self, level: int, keep: bool = False) -> None: ...
    def device_copy_back(self) -> str: ...
    def wake(self) -> WakeSource: ...
    def weights_to_host(self) -> str: ...
    def host_copy_ahead(self) -> int: ...
    def stop(self) -> None: ...
    def files(self) -> tuple[tuple[str, int, int], ...]: ...
    def gpu_need(self) -> GpuNeed: ...


class Engine:
    """The real one: a server process per model, on a loopback port of its own."""

    def __init__(self, model: ModelConfig, log_dir: Path, socket_dir: str = "", parking: bool = True,
                 start_jobs: int = 1, keep_kv: bool = True, held_kv: str = "gpu") -> None:
        self.model, self.kind = model, KINDS[model.engine]
        self.parks = self.kind.parks(parking)
        self._keep_kv, self._held_kv = keep_kv, held_kv
        self.held = False  # parked keeping its KV cache and requests in flight: its wake lets them go on
        self.pinned = False  # its pinned host buffers for a held park's KV cache made (``parking.park_asks``)
        self.log_path = log_dir / f"{model.name.replace('/', '_')}.log"
        self.process = EngineProcess(model.name, self.log_path)
        self._ahead = EngineProcess(model.name, self.log_path)  # its compile ahead (``compile_ahead``), if one runs
        self._need: GpuNeed | None = None
        self.start_jobs, self.socket_dir = start_jobs, socket_dir
        self.keeper = KeeperView(model, self.kind, socket_dir, self.env(socket_dir))
        self.started_before = False  # a start again asks the keeper first (``cached_again``)

    url = property(lambda self: self.process.url)
    pid = property(lambda self: self.process.pid)
    port = property(lambda self: self.process.port)
    server = property(lambda self: self.process.server)
    exit_code = property(lambda self: self.process.exit_code)

    @property
    def keeps_kv(self) -> bool:
        """Whether its park keeps the generations in flight, paused with their KV caches (a stream held across it
        goes on at the wake: nothing computed again), rather than waiting for them or having them cut."""
        return self.kind.keeps_kv and self.parks and self._keep_kv

    @property
    def kv_to_host(self) -> bool:
        """Whether a park that keeps the generations moves their KV cache to pinned host memory (``held_kv =
        "host"``, vLLM's): it then keeps on the GPU only what a park without them does."""
        return self.keeps_kv and self._held_kv == "host" and self.kind.moves_kv_to_host

    def pids(self) -> list[int]:
        return self.process.pids()

    def alive(self) -> bool:
        return self.process.alive()

    def env(self, socket_dir: str) -> dict[str, str]:
        """Its preload's, engine's and host copies' environment: the front's, with the model's GPUs."""
        env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}  # the front checks keys, not engines
        if self.model.gpus:  # the cache keys name GPUs by UUID: any order of them finds its entries
            env["CUDA_VISIBLE_DEVICES"] = self.model.cuda_visible_devices()
        if self.kind.keeps_standbys:
            # a standby for each start of a batch (schedule.startup_batch), and one more for the preloads' loaders
            # (``launcher.run_module``): on an H200 (three 8B, the front's defaults) a preload took the one standby
            # and the start right after it waited 17-25 s for the next to import. Engines that profile the GPU's
            # memory too: the models after the first take the KV cache its profile gave and start together, beside
            # it (with 2 places for them, on an H100 the second of two such starts waited 12 s for a standby)
            starts = self.start_jobs if self.start_jobs > 1 else 1
            env[PLACES_ENV] = str(starts + 1)
        return {**env, "HOTWEIGHTS_SOCKET_DIR": socket_dir} if socket_dir else env

    def command(self, port: int) -> tuple[list[str], dict[str, str]]:
        """Its server's command and environment: it dies with this front (``unix.die_with_parent``)."""
        cmd, extra = self.kind.command(self.model, port, self.parks)
        return cmd, {**self.keeper.env, **extra, DIE_WITH_ENV: str(os.getpid())}

    def preload_command(self) -> list[str]:
        return self.kind.preload_command(self.model, self.parks)

    def preload(self, timeout_s: float = 1800.0) -> PreloadOutcome:
        """The model's weights into the keeper (``hotweights preload`` starts a keeper when none runs), once. Their
        host copy (``parked_weights = "host"``) is the caller's next step (``startup.preload_then_copy``): it
        takes no GPU memory of a preload's, so the preloads' admission lets go of it first."""
        already = self.cached_already()
        if already is not None:
            return already
        try:
            done = subprocess.run([sys.executable, "-m", "hotweights", *self.preload_command()], capture_output=True,
                                  text=True, env=self.keeper.env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return PreloadOutcome("failed", f"the preload took over {timeout_s:.0f} s")
        if done.returncode == 0:
            return PreloadOutcome("cached")
        return PreloadOutcome("failed", one_line((done.stderr.strip().splitlines() or ["no output"])[-1], 200))

    def device_copy_off(self) -> str:
        """Where this model's parked weights go to host memory and the keeper holds both copies of them (a front
        before this one stopped while it was awake), the GPU copy let go until its start: the switch counts such a
        model's weights on the GPU only while its engine is resident, and 15 GiB it does not count made other
        starts fail (H200, ten 8B, a front started again). What it did, in a few words ("" where nothing was
        to do)."""
        if self.model.parked_weights != "host" or not self.parks:
            return ""
        try:
            let_go = self.keeper.device_copy_off()
        except (OSError, HotweightsError) as exc:
            return f"its GPU copy kept ({one_line(str(exc), 120)})"
        return f"its GPU copy let go until its start, {size_text(let_go)}" if let_go else ""

    def device_copy_back(self) -> str:
        """Where the keeper holds only the host copy of this model's weights (a host-tier model parked before, by a
        front before this one or by a deep park whose engine died since), their GPU copy made again from it (an
        upload, not a preload of a whole start) for its engine's start to map. What it did, in a few words ("" where
        nothing was to do, or no keeper answers: the start says what it maps)."""
        if self.kind.not_preloaded(self.model):
            return ""  # its engine reads its checkpoint: nothing of it in the keeper to ask about
        began = time.monotonic()
        try:
            made = self.keeper.promote()
        except (OSError, HotweightsError):
            return ""
        except EngineError as exc:
            return f"its GPU copy not made from its host copy ({one_line(str(exc), 160)})"
        return f"its GPU copy made from its host copy, {time.monotonic() - began:.1f} s" if made else ""

    def cached_already(self) -> PreloadOutcome | None:
        """Its preload's outcome where no preload process runs (its engine reads its checkpoint itself, or the keeper
        holds its weights already: what is left is bookkeeping of its copies), or None where one must: start-up asks
        this of every model first, with no GPU memory admitted for it."""
        skip = self.kind.not_preloaded(self.model)
        if skip:
            return PreloadOutcome("skipped", skip)
        try:
            if self.keeper.cached():
                notes = (self.host_copy_after(), self.device_copy_off())
                return PreloadOutcome("already", "; ".join(note for note in notes if note))
        except (OSError, HotweightsError):  # no keeper yet (the preload starts one), or a checkpoint it reports
            pass
        return None

    def cached_again(self) -> str:
        """Before its engine starts again (a crash, a stop, a park that stopped it): where the keeper no longer holds
        its weights (stopped under the running front, ``hotweights stop``; or the entry released), they are
        preloaded again, which starts a keeper where none runs, so that the start maps them rather than read its
        checkpoint with no word from the front. What happened, in a few words ("" where the keeper holds them)."""
        if self.kind.not_preloaded(self.model):
            return ""
        try:
            if self.keeper.cached():
                return ""
            why = "the keeper no longer holds its weights (released?)"
        except (OSError, HotweightsError) as exc:
            why = f"no keeper answers ({one_line(str(exc), 120)}: stopped with `hotweights stop`?)"
        outcome = self.preload()
        if outcome.failed:
            return f"{why}; preloading them again failed ({outcome.note}): its engine reads its checkpoint"
        return f"{why}; preloaded again ({outcome}), a keeper started where none ran"

    def host_copy_after(self) -> str:
        """Where this model's parked weights go to host memory, their host copy made now, after its preload (its GPU
        copy kept), so that its first park only lets the GPU copy go: made at that park instead, it held start-up's
        starts back ~20 s per model (H200, four 8B on the host tier). What it did, in a few words ("" where the
        weights stay on the GPU); one that fails is made at the first park, as before."""
        if self.model.parked_weights != "host" or not self.parks:
            return ""
        began = time.monotonic()
        try:
            made = self.keeper.host_copy_ahead()
        except (EngineError, OSError, HotweightsError) as exc:
            return f"no host copy yet: {one_line(str(exc), 120)}"
        return f"its host copy made, {time.monotonic() - began:.1f} s" if made else ""

    def pin_kv_as(self, other: EngineLike) -> int:
        """Where ``other`` sized its KV cache from a profile of the GPU's memory at its start and this engine would
        start as it did (the same kind, arguments and GPUs, config files and weights' size: vLLM's profile gives
        them the same KV cache), this engine's is pinned to that size (``--kv-cache-memory-bytes``): it profiles
        nothing, so it starts beside other starts and preloads (``GpuNeed.profiles``). The bytes pinned, 0 where
        it is not (``other`` profiled nothing, starts otherwise, or its output does not say)."""
        mine, theirs = self.model, other.model
        if (other is self or mine.engine != theirs.engine or not self.gpu_need().profiles
                or self.gpu_need() != other.gpu_need() or not self.kind.same_profile(mine, theirs)):
            return 0
        nbytes = self.kind.kv_profiled(other.start_output()) or 0
        if nbytes:
            self.model = dataclasses.replace(mine, args=self.kind.with_kv(mine.args, nbytes))
            self._need = None
            self.keeper = KeeperView(self.model, self.kind, self.socket_dir, self.env(self.socket_dir))
        return nbytes

    def start_output(self) -> str:
        """What its start (the one going on, or the last) has written to its log."""
        return self.process.output()

    def compiled(self) -> bool:
        """Whether its start going on has compiled its engine's code (``kinds.compiled_in``): a start of the same
        config beside it now loads that code, not compiles it again. False where no start of it runs."""
        return self._start_says("compiled", lambda log: self.kind.compiled_in(self.model, log))

    def profiled(self) -> bool:
        """Whether its start going on has sized its KV cache from its profile of the GPU's memory (its output says
        the size): what others allocate from now on no longer counts as its own. False where no start of it runs."""
        return self._start_says("profiled", lambda log: self.kind.kv_profiled(log) is not None)

    def _start_says(self, what: str, says: Callable[[str], bool]) -> bool:
        """Whether the start going on has said ``what`` (``says`` of its output since it began; a log may hold an
        earlier front's too). Asked by start-up's sampling only until its start has moved past it
        (``Startup.sample``)."""
        proc = self.process.proc
        return proc is not None and proc.poll() is None and says(self.process.output())

    def compiles_ahead(self, total_mib: int) -> bool:
        """Whether its kind has a compile ahead of its first start to run (``kinds.compile_ahead_command``)."""
        return self.kind.compile_ahead_command(self.model, 0, self.parks, total_mib) is not None

    def compile_ahead(self, total_mib: int, timeout_s: float = 900.0) -> float | None:
        """Its first start's compile, run now by a server of its own without its weights (``kinds``:
        ``compile_ahead_command``; ``total_mib``: its GPU's memory), stopped once ready; the seconds it took, or None
        where its kind has none to run. EngineError (its reason, one line) where it failed: the start then
        compiles itself. Its log: ``<name>.compile-ahead.log`` beside the engine's."""
        def command(port: int) -> tuple[list[str], dict[str, str]]:
            cmd, extra = self.kind.compile_ahead_command(self.model, port, self.parks, total_mib) or ([], {})
            return cmd, {**self.keeper.env, **extra, DIE_WITH_ENV: str(os.getpid())}

        if not self.compiles_ahead(total_mib):
            return None
        self._ahead = ahead = EngineProcess(f"{self.model.name}'s compile ahead",
                                            self.log_path.with_suffix(".compile-ahead.log"))
        logger.info("switch: %s: compiling ahead of its first start, beside its preload (vLLM with dummy weights; "
                    "log: %s)", self.model.name, ahead.log_path)
        try:
            return ahead.start(command, timeout_s)
        finally:
            ahead.stop()

    def start(self, timeout_s: float = 900.0) -> float:
        """Start its engine; the seconds it took. Where the keeper holds only the host copy of its weights, their GPU
        copy is made again first, within those seconds (``device_copy_back``); a start again finds the keeper first
        (``cached_again``)."""
        began = time.monotonic()
        self.held = self.pinned = False
        again = self.cached_again() if self.started_before else ""
        if again:
            logger.warning("switch: %s: %s", self.model.name, again)
        self.started_before = True
        back = self.device_copy_back()
        copied_s = time.monotonic() - began if back else 0.0
        if back:
            logger.info("switch: %s: %s", self.model.name, back)
        try:
            return self.process.start(self.command, timeout_s) + copied_s
        except EngineError:
            if back:  # failed: not resident, so the GPU copy made for it is not counted either: let it go
                self.device_copy_off()
            raise

    def park(self, level: int, keep: bool = False) -> None:
        """Park at ``level``, its KV cache and requests in flight kept where ``keep`` (``parking.py``); where the engine
        cannot park, stop it."""
        if not self.parks:
            self.stop()
            return
        self.held = keep and self.keeps_kv
        pin = self.kv_to_host and not self.held and not self.pinned  # once a process: an RPC of its own
        try:
            for path, body in park_asks(self.kind.name, level, self.held, self.kv_to_host, pin):
                self.process.ask(path, timeout_s=120, body=body)
            self.pinned |= pin
        except OSError as exc:
            raise EngineError(f"{self.model.name}: would not park: {one_line(str(exc))}") from None

    def wake(self) -> WakeSource:
        """Awake again: where its weights came from (``kept``: mapped all along, ``gpu``, ``host``, ``disk``;
        ``start`` where it could not park and starts again). WakeRefused when the engine refused for memory."""
        if not self.alive():
            self.start()
            return WakeSource.START
        since = self.process.log_size()
        try:
            for path, body in wake_asks(self.kind.name, self.held):  # each may be asked again (a wake tried again)
                self.process.ask(path, timeout_s=WAKE_TIMEOUT_S, body=body)
        except OSError as exc:
            refusal = evidence.wake_refusal(self.process.output(since))
            reason = one_line(refusal.reason if refusal else str(exc))
            kind = WakeRefused if refusal and refusal.for_memory else EngineError
            raise kind(f"{self.model.name}: would not wake: {reason}") from None
        self.held = False
        return WakeSource(evidence.woke_source(self.process.output(since)) or WakeSource.KEPT)

    def weights_to_host(self) -> str:
        return self.keeper.weights_to_host(set(self.pids()))

    def host_copy_ahead(self) -> int:
        return self.keeper.host_copy_ahead()

    def stop(self) -> None:
        """Its server stopped, and its compile ahead if one runs (its start then fails at once: the front stops)."""
        self._ahead.stop()
        self.process.stop()

    def files(self) -> tuple[tuple[str, int, int], ...]:
        """The checkpoint's files as they are now (name, size, mtime): a start that failed is tried again at once
        when they changed."""
        try:
            found = sorted(os.scandir(self.model.checkpoint), key=lambda e: e.name)
            return tuple((e.name, (st := e.stat()).st_size, st.st_mtime_ns) for e in found if e.is_file())
        except OSError:
            return ()

    def gpu_need(self) -> GpuNeed:
        """What it takes of its GPUs (``memory.py``), read once: its checkpoint's shards and config.json."""
        if self._need is None:
            self._need = self.kind.gpu_need(self.model)
        return self._need
