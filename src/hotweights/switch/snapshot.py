"""What the scheduler decides over: the switch's models at one moment (``Snapshot``), each as a frozen ``View``, taken
by ``Lifecycle.snapshot`` under its lock with no await, so nothing changes between what was read and what was
decided. ``schedule.py``'s rules are functions of these values alone: no engine, no directory scan, no log read, no
clock. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .config import ModelConfig
from .memory import GpuNeed, Holder
from .states import Failure, ModelState, PreloadState, StartState


@dataclass(frozen=True, slots=True)
class View:
    """One model as the scheduler sees it: its state, how far its start and its preload have gone, its requests
    (waiting, let in and not yet taken up, in flight; each waiting one's ``time.monotonic()`` of arrival), when it
    was last used (``time.time()``), its failure, and what it takes of its GPUs."""

    config: ModelConfig
    state: ModelState
    need: GpuNeed
    start: StartState = StartState.UP
    parks: bool = True  # False: a park stops its engine
    waiting: int = 0
    reserved: int = 0
    inflight: int = 0
    last_used: float = 0.0
    arrivals: tuple[float, ...] = ()
    failure: Failure | None = None
    files_changed: bool = False  # its checkpoint's files differ from those its failed start saw
    preload: PreloadState = PreloadState.DONE
    awaited: bool = False  # its start waits for its preload
    dues: tuple[float | None, ...] = ()  # per waiting request (as ``arrivals``): its next token's due time, or None
    awake_at: float = 0.0  # time.monotonic() it last became awake
    wake_s: float | None = None  # what its wakes took lately (None: none yet)
    park_s: float | None = None  # what its parks took lately (None: none yet)
    kv_held: bool = False  # parked (or leaving to park) keeping its KV cache for the streams it holds
    kv_host: bool = False  # a park that holds streams moves their KV cache to host memory (``held_kv = "host"``)
    can_hold: bool = False  # a park now would hold streams with their KV caches (its engine's park keeps them)
    deepens: bool = False  # its engine can deepen a park (level 1 to 2: the embedded engine's, not vLLM's)
    left_for: str = ""  # the model its engine last left for, until that one is awake (``schedule.wanted``)
    clocks: tuple[tuple[float, float, int], ...] = ()  # each stream in flight that may pause: when it came, its
    # first byte (0: none yet), its tokens so far (``turns.slack_s``)
    coming: tuple[float, ...] = ()  # when each request came that is in flight, on its way to its engine, its stream
    # not among ``clocks`` yet (its first token still due: ``turns.slack_s``)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def started(self) -> bool:
        """Start-up (or a request) has reached it: its engine was started once, or is starting."""
        return self.start is not StartState.WAITING

    @property
    def profiled(self) -> bool:
        """Its start going on has sized its KV cache from a profile of the GPU's memory."""
        return self.start is StartState.PROFILED

    @property
    def compiled(self) -> bool:
        """Its start going on has compiled its engine's code (its profile comes after)."""
        return self.start in (StartState.COMPILED, StartState.PROFILED)

    @property
    def preloaded(self) -> bool:
        """Its preload is done: its start waits for nothing."""
        return self.preload is PreloadState.DONE

    @property
    def weights_kept(self) -> bool:
        """Its weights stay on the GPU while it is parked (``parked_weights = "gpu"``, or its engine cannot park)."""
        return self.config.parked_weights == "gpu" or not self.parks

    def waited_s(self, now: float) -> float:
        """How long its longest-waiting request has waited at ``now``."""
        return now - min(self.arrivals) if self.arrivals else 0.0

    def holder(self, state: ModelState | None = None, kept: bool | None = None) -> Holder:
        """It as the memory model sees it (in ``state``, else its own; a model start-up has not reached holds no
        engine), its KV cache kept parked where ``kept`` says (else as it is now)."""
        state = state or (self.state if self.started else ModelState.STOPPED)
        kept = self.kv_held if kept is None else kept
        return Holder(self.need, state, self.weights_kept, kept and not self.kv_host)


@dataclass(frozen=True)
class Snapshot:
    """The switch at ``now`` (``time.monotonic()``): its models in the configured order, each GPU's MiB
    (``totals``), the default model's name, and start-up's preloads: how many at once (``jobs``), whether they run
    ahead of the starts (``preloads_ahead``), the needs of those running and of the compile ahead, by model, and
    whether the front's first start compiles its engine's code itself (no compile ahead did it)."""

    models: tuple[View, ...]
    totals: Mapping[int, int]
    now: float
    default: str
    jobs: int = 1
    preloads_ahead: bool = False
    running: Mapping[str, GpuNeed] = field(default_factory=dict)
    compiling: Mapping[str, GpuNeed] = field(default_factory=dict)
    first_start_compiles: bool = True

    def __getitem__(self, name: str) -> View:
        return next(v for v in self.models if v.name == name)

    @property
    def preloading(self) -> dict[int, int]:
        """What the preloads running hold on each GPU at their peaks, counted whole (MiB)."""
        return {g: sum(n.preload_mib(total) for n in self.running.values() if g in n.gpus)
                for g, total in self.totals.items()}

    def moved(self, names: Iterable[str], to: ModelState, held: Iterable[str] = ()) -> Snapshot:
        """The same moment with ``names`` in state ``to`` (those of them in ``held`` to park keeping their KV
        caches): what a plan sees after its own first steps."""
        gone, kept = set(names), set(held)
        views = tuple(dataclasses.replace(v, state=to, kv_held=v.name in kept) if v.name in gone else v
                      for v in self.models)
        return dataclasses.replace(self, models=views)
