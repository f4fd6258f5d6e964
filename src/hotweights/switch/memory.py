"""GPU memory as the switch models it, in one place: what a model's preload, start and engine take on each of its
GPUs (``GpuNeed``, from its kind's row), what it holds in each state (``held_mib``), and whether a set of states
fits a GPU (``over_mib``). The scheduler decides wakes and parks by it (``schedule.room_for``), the start-up line
says each GPU's worst moment by it (``fit.py``), the preloads are admitted by it (``startup.py``).

Per GPU a model holds:

- its weights, in the keeper: always where its parked weights stay on the GPU (``parked_weights = "gpu"``, or
  parking off), else only while its engine is resident (starting, awake or leaving: a wake uploads them);
- its engine's own memory: resident, its share of the GPU less the weights it maps (vLLM's
  ``--gpu-memory-utilization``: ``engines/vllm/budget.engine_share``, the rule the engine's own start applies) or,
  where its arguments pin its KV cache (``--kv-cache-memory-bytes``), that KV cache and the activations beside it;
  plus what a parked engine keeps (its CUDA context and graphs, read on an H200); parked, only that, unless its park
  kept its KV cache for the streams it holds (``kv_kept``: issue 69), then that KV cache too (its activations given
  back: vLLM's held park empties torch's cache), or all of its own memory but the weights where its KV cache is not
  pinned; stopped, nothing.

An estimate from the configuration, not a reading: it is what lets the switch decide without awaiting a read
between looking at its models and acting (an engine's own wake still refuses when the GPU has too little: the
switch then parks one more). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..engines.vllm.budget import engine_share
from ..config import DEFAULT_POOL_BYTES
from .states import RESIDENT, ModelState

CONTEXT_MIB = 1024  # a CUDA context with torch's kernels loaded, as an embedded engine's preload and start take it
POOL_MIB = DEFAULT_POOL_BYTES >> 20  # the one pool a loader-alone preload writes at a time beside the weights
RESERVE_MIB = 1024  # of each GPU, never planned for: other processes, fragmentation, the estimate's error


@dataclass(frozen=True, slots=True)
class GpuNeed:
    """What a model's preload and its engine take on each of its GPUs (``gpus``: CUDA indices among those the front
    sees): a ``share`` of the GPU's memory (vLLM's ``--gpu-memory-utilization``, which its mapped weights count
    towards), its weights (per GPU; they stay in the keeper once preloaded), a fixed ``extra``, the KV cache a preload
    pins (``kv_mib``) or the engine's arguments pin (``engine_kv_mib``), and what the engine keeps parked."""

    gpus: tuple[int, ...]
    share: float = 0.0
    weights_mib: int = 0
    extra_mib: int = 0
    kv_mib: int = 0  # the KV cache its preload pins, or its arguments give (0: its engine sizes it from ``share``)
    parked_mib: int = 0  # what its engine keeps on the GPU while parked (context, CUDA graphs)
    engine_kv_mib: int = 0  # the KV cache its engine's arguments pin (0: sized from ``share``)
    activations_mib: int = 0  # its engine's activations beside a KV cache its arguments pin (its kind's number)
    scratch_mib: int = 0  # what its preload takes beside two copies of the weights and a pinned KV cache (its kind's)
    loader_only: bool = False  # its preload runs the engine's loader alone (no engine start): ``preload_mib``

    @property
    def profiles(self) -> bool:
        """Whether its engine's start sizes its KV cache from a profile of the GPU's memory (anything another
        process allocates meanwhile counts as its own): every start but one whose arguments pin its KV cache
        (vLLM 0.26 skips the profile where ``--kv-cache-memory-bytes`` is given). Such a start goes alone on its
        GPUs; one that does not profile may start beside other starts and preloads."""
        return not self.engine_kv_mib

    def preload_mib(self, total_mib: int) -> int:
        """At the preload's peak: an engine of its own loads the weights while it publishes a copy of them, within
        its ``share``, or (its KV cache pinned) beside its weights, its pinned KV cache and its ``scratch_mib``;
        vLLM asks for its ``share`` free at start either way. A preload by the engine's loader alone (``loader_only``:
        vLLM's of one rank, ``engines/vllm/publish.py``) starts no engine and publishes pool by pool, each original
        freed once its pool is sealed (``loading/publish.py``): the weights, one pool and a CUDA context. Counted as
        a whole start's (two copies of the weights beside 3 GiB) it held the preloads of ten 8B on an H200 back
        behind the host-tier models' GPU copies, the last three one at a time from 146 s to 196 s."""
        if self.loader_only:
            return self.weights_mib + POOL_MIB + CONTEXT_MIB + self.extra_mib
        share = math.ceil(self.share * total_mib)
        if self.kv_mib:
            return max(share, 2 * self.weights_mib + self.kv_mib + self.scratch_mib) + self.extra_mib
        return share + self.weights_mib + self.extra_mib

    @property
    def ahead_mib(self) -> int:
        """A compile ahead of its engine's first start (``kinds.compile_ahead_command``: weights of its own, random, and
        a KV cache no larger than its preload's): those, its activations and what an engine keeps parked (context,
        CUDA graphs)."""
        return self.weights_mib + self.kv_mib + self.activations_mib + self.parked_mib + self.extra_mib

    def start_mib(self, total_mib: int) -> int:
        """Free memory its engine's start needs, its weights mapped from the keeper."""
        return max(0, engine_share(total_mib, self.share, self.weights_mib)) + self.extra_mib

    def awake_mib(self, total_mib: int) -> int:
        """Its engine's own memory while it serves (its weights aside): what it keeps parked with its KV cache, and
        its activations beside a pinned KV cache (a KV cache sized from its share counts them already)."""
        return self.kept_mib(total_mib) + (self.activations_mib if self.engine_kv_mib else 0)

    def kept_mib(self, total_mib: int) -> int:
        """Its engine's own memory parked keeping its KV cache (its weights aside): a pinned KV cache beside what any
        parked engine keeps, else (a KV cache sized from its share) all of its awake memory."""
        if self.engine_kv_mib:
            return self.engine_kv_mib + self.extra_mib + self.parked_mib
        return self.start_mib(total_mib) + self.parked_mib


@dataclass(frozen=True, slots=True)
class Holder:
    """A model as memory sees it: its need, its state, and whether its weights stay on the GPU while parked."""

    need: GpuNeed
    state: ModelState
    weights_kept: bool  # parked_weights = "gpu" (or parking off): the keeper keeps its entry on the GPU
    kv_kept: bool = False  # parked keeping its KV cache for the streams it holds


def held_mib(h: Holder, total_mib: int) -> int:
    """What ``h`` holds on each of its GPUs (of ``total_mib``) in its state: its weights where they are on the GPU,
    and its engine's own memory."""
    n = h.need
    if not n.gpus:
        return 0
    resident = h.state in RESIDENT
    weights = n.weights_mib if (h.weights_kept or resident) else 0
    if resident:
        return weights + n.awake_mib(total_mib)
    if h.state in (ModelState.PARKED, ModelState.DEEP):
        return weights + (n.kept_mib(total_mib) if h.kv_kept else n.parked_mib)
    return weights  # stopped or failed: no engine, its weights wherever the keeper keeps them


def over_mib(gpu: int, total_mib: int, holders: Iterable[Holder]) -> int:
    """How far ``holders`` on ``gpu`` run past what may be planned of it (> 0: they do not fit)."""
    return sum(held_mib(h, total_mib) for h in holders if gpu in h.need.gpus) - (total_mib - RESERVE_MIB)
