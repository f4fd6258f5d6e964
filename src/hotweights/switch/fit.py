"""Whether a switch's models fit each GPU at the worst moment, from their configuration alone, said once at start-up
(before a quarter of an hour of preloads and starts finds out), with how many of them fit awake at once.

Per GPU, by the switch's memory model (``memory.py``, its total from ``nvidia-smi``): the weights of every model
parked on the GPU tier stay there, the engines that cost the most are awake (``max_awake`` of them where it is set,
else as many as fit: the switch keeps engines awake while memory allows), and every other engine is parked, holding
its residue. Where even one awake does not fit, the line says what to change: a model whose start or wake finds too
little free would fail or wait. An estimate (an engine's memory beyond its share, a residue per kind), not a
promise; torch-free.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from .config import ModelConfig, SwitchConfig
from .gpus import GpuMemory
from .kinds import FEWER_SEQS, FEWER_TOKENS, KINDS
from .memory import RESERVE_MIB, GpuNeed, Holder, held_mib
from .states import ModelState

logger = logging.getLogger("hotweights.switch")


@dataclass(frozen=True, slots=True)
class GpuFit:
    gpu: int
    total_mib: int
    kept_mib: int  # weights of the GPU-tier models
    kept: int
    awake_mib: int  # the engines that cost the most, awake (their weights in it where they are host-tier)
    awake: int
    parked_mib: int  # every other engine's residue
    parked: int
    models: int = 0  # on this GPU
    fit_awake: int = 0  # how many of them fit awake at once (the costliest first)
    fewer_seqs_awake: int = 0  # as many, with ``fewer`` added to each vLLM model's args (0: not said)
    fewer: tuple[str, ...] = FEWER_SEQS + FEWER_TOKENS

    @property
    def need_mib(self) -> int:
        return self.kept_mib + self.awake_mib + self.parked_mib

    def line(self) -> str:
        gib = 1024
        what = (f"GPU {self.gpu}: at most about {self.need_mib / gib:.1f} of {self.total_mib / gib:.1f} GiB "
                f"({self.kept} model(s)' weights kept on it {self.kept_mib / gib:.1f} GiB, {self.awake} awake "
                f"{self.awake_mib / gib:.1f} GiB, {self.parked} parked about {self.parked_mib / gib:.1f} GiB); "
                f"{self.fit_awake} of {self.models} fit awake at once")
        if self.fewer_seqs_awake > self.fit_awake:
            why = [w for flag, w in (("--max-num-seqs", "its CUDA graphs, which stay on the GPU while it is parked, "
                                                           "then cover batches of up to 64"),
                                     ("--max-num-batched-tokens", "a step's activations 2,048 tokens"))
                   if flag in self.fewer]
            what += f" ({self.fewer_seqs_awake} with {' '.join(self.fewer)} in each vLLM model's args: "
            what += f"{', '.join(why)})"
        if self.need_mib <= self.total_mib:
            return what
        return (f"{what}: does not fit, and a start or wake that finds too little free fails or waits: keep fewer "
                f"models' weights on it (parked_weights = \"host\") or give each engine less "
                f"(--gpu-memory-utilization or --kv-cache-memory-bytes for vLLM)")


def fits(config: SwitchConfig, need: Callable[[ModelConfig], GpuNeed],
         memory: dict[int, GpuMemory]) -> list[GpuFit]:
    """The worst moment of each GPU in ``memory`` that a model of ``config`` uses."""
    needs = {m.name: need(m) for m in config.models}
    return [_fit(config, needs, gpu, mem.total_mib) for gpu, mem in sorted(memory.items())
            if any(gpu in n.gpus for n in needs.values())]


def _fit(config: SwitchConfig, needs: dict[str, GpuNeed], gpu: int, total_mib: int) -> GpuFit:
    on = [m for m in config.models if gpu in needs[m.name].gpus]

    def holder(m: ModelConfig, state: ModelState) -> Holder:
        n = needs[m.name]
        if not config.parking:  # a park stops the engine: nothing stays behind it
            n = dataclasses.replace(n, parked_mib=0)
        return Holder(n, state, m.parked_weights == "gpu" or not config.parking)

    def cost(m: ModelConfig) -> int:  # what waking it adds
        return held_mib(holder(m, ModelState.AWAKE), total_mib) - held_mib(holder(m, ModelState.PARKED), total_mib)

    parked_all = sum(held_mib(holder(m, ModelState.PARKED), total_mib) for m in on)
    costliest = sorted(on, key=cost, reverse=True)
    fit_awake, used = 0, parked_all
    for m in costliest:
        used += cost(m)
        if used > total_mib - RESERVE_MIB:
            break
        fit_awake += 1
    awake = costliest[:max(1, min(config.awake_cap or len(on), fit_awake))]
    parked = [m for m in on if m not in awake]
    kept = [m for m in on if m.parked_weights == "gpu" or not config.parking]

    def engine_parked(m: ModelConfig) -> int:
        return held_mib(holder(m, ModelState.PARKED), total_mib) - (needs[m.name].weights_mib if m in kept else 0)

    kept_mib = sum(needs[m.name].weights_mib for m in kept)
    awake_mib = sum(held_mib(holder(m, ModelState.AWAKE), total_mib) for m in awake) - sum(
        needs[m.name].weights_mib for m in awake if m in kept)
    return GpuFit(gpu, total_mib, kept_mib, len(kept), awake_mib, len(awake), sum(map(engine_parked, parked)),
                  len(parked), len(on), fit_awake)


def with_fewer_seqs(config: SwitchConfig) -> SwitchConfig | None:
    """``config`` with what its kind adds for an engine that keeps less on the GPU parked (``fewer_seqs``: vLLM's
    ``FEWER_SEQS`` where a model sets neither ``--max-num-seqs`` nor ``--enforce-eager``) in each model's args; None
    where no model's kind adds anything."""
    added = [KINDS[m.engine].fewer_seqs(m.args) for m in config.models]
    if not any(added):
        return None
    models = tuple(dataclasses.replace(m, args=(*m.args, *more)) if more else m
                   for m, more in zip(config.models, added))
    return dataclasses.replace(config, models=models)


def say_fit(config: SwitchConfig, need: Callable[[ModelConfig], GpuNeed],
            memory: Callable[[], dict[int, GpuMemory]]) -> list[GpuFit]:
    """Log each GPU's worst moment (a warning where it does not fit); nothing where no GPU is seen. Where more
    would fit awake with ``FEWER_SEQS`` and ``FEWER_TOKENS`` in the vLLM models' args, the line says how many."""
    seen = memory()
    found = fits(config, need, seen) if seen else []
    fewer = with_fewer_seqs(config) if found else None
    if fewer is not None:
        alt = {f.gpu: f.fit_awake for f in fits(fewer, need, seen)}
        added = max((KINDS[m.engine].fewer_seqs(m.args) for m in config.models), key=len)
        found = [dataclasses.replace(f, fewer_seqs_awake=alt.get(f.gpu, 0), fewer=added) for f in found]
    for fit in found:
        (logger.info if fit.need_mib <= fit.total_mib else logger.warning)("switch: %s", fit.line())
    return found
