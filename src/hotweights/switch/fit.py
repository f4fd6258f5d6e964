"""Whether a switch's models fit each GPU at the worst moment, from their configuration alone, said once at start-up
(before a quarter of an hour of preloads and starts finds out).

Per GPU (``kinds.GpuNeed``, its total from ``nvidia-smi``): the weights of every model parked on the GPU tier stay
there, the ``max_awake`` engines that cost the most are awake (an engine's own memory, its share less its mapped
weights, plus a host-tier model's weights, which come back to the GPU while it is awake), and every other engine is
parked, holding its residue (``PARKED_MIB``, read on an H200: CUDA context and graphs). Where that is more than the
GPU has, the line says what to change: a model whose start or wake finds too little free would fail or wait.
An estimate (an engine's memory beyond its share, a residue per kind), not a promise; torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .config import ModelConfig, SwitchConfig
from .gpus import GpuMemory
from .kinds import GpuNeed

logger = logging.getLogger("hotweights.switch")
# what a parked engine keeps on its GPU, read on an H200 (8B, CUDA graphs): vLLM 1,898-1,912 MiB (context 0.6 GiB,
# graphs 1.0), the embedded engine 712-892 MiB (benchmarks/results/gpu_load/)
PARKED_MIB = {"vllm": 1950, "hotweights": 900}


@dataclass(frozen=True, slots=True)
class GpuFit:
    gpu: int
    total_mib: int
    kept_mib: int  # weights of the GPU-tier models
    kept: int
    awake_mib: int  # the ``max_awake`` engines that cost the most, awake
    awake: int
    parked_mib: int  # every other engine's residue
    parked: int

    @property
    def need_mib(self) -> int:
        return self.kept_mib + self.awake_mib + self.parked_mib

    def line(self) -> str:
        gib = 1024
        what = (f"GPU {self.gpu}: at most about {self.need_mib / gib:.1f} of {self.total_mib / gib:.1f} GiB "
                f"({self.kept} model(s)' weights kept on it {self.kept_mib / gib:.1f} GiB, {self.awake} awake "
                f"{self.awake_mib / gib:.1f} GiB, {self.parked} parked about {self.parked_mib / gib:.1f} GiB)")
        if self.need_mib <= self.total_mib:
            return what
        return (f"{what}: does not fit, and a start or wake that finds too little free fails or waits: keep fewer "
                f"models' weights on it (parked_weights = \"host\") or give each engine less "
                f"(--gpu-memory-utilization for vLLM)")


def fits(config: SwitchConfig, need: Callable[[ModelConfig], GpuNeed],
         memory: dict[int, GpuMemory]) -> list[GpuFit]:
    """The worst moment of each GPU in ``memory`` that a model of ``config`` uses."""
    needs = {m.name: need(m) for m in config.models}
    return [_fit(config, needs, gpu, mem.total_mib) for gpu, mem in sorted(memory.items())
            if any(gpu in n.gpus for n in needs.values())]


def _fit(config: SwitchConfig, needs: dict[str, GpuNeed], gpu: int, total_mib: int) -> GpuFit:
    on = [m for m in config.models if gpu in needs[m.name].gpus]
    kept = {m.name for m in on if m.parked_weights == "gpu" or not config.parking}

    def residue(m: ModelConfig) -> int:
        return PARKED_MIB.get(m.engine, 0) if config.parking else 0

    def awake_cost(m: ModelConfig) -> int:
        n = needs[m.name]
        return n.start_mib(total_mib) + residue(m) + (0 if m.name in kept else n.weights_mib)

    awake = sorted(on, key=awake_cost, reverse=True)[:max(1, config.max_awake)]
    parked = [m for m in on if m not in awake]
    return GpuFit(gpu, total_mib, sum(needs[n].weights_mib for n in kept), len(kept), sum(map(awake_cost, awake)),
                  len(awake), sum(map(residue, parked)), len(parked))


def say_fit(config: SwitchConfig, need: Callable[[ModelConfig], GpuNeed],
            memory: Callable[[], dict[int, GpuMemory]]) -> list[GpuFit]:
    """Log each GPU's worst moment (a warning where it does not fit); nothing where no GPU is seen."""
    seen = memory()
    found = fits(config, need, seen) if seen else []
    for fit in found:
        (logger.info if fit.need_mib <= fit.total_mib else logger.warning)("switch: %s", fit.line())
    return found
