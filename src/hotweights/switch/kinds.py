"""The engines a switch can run, one table row each (``KINDS``, found by the config's ``engine``): the command of
its server, the preload that fills the keeper for it, which keeper entries are its own, whether it parks.

- ``hotweights``: ``hotweights serve MODEL`` (parks: ``/sleep``, ``/wake_up``, on loopback only);
- ``vllm``: ``hotweights vllm serve MODEL`` (from the warm standby), the engine layout the preload made mapped
  zero-copy, with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` where vLLM has a sleep mode (its GPU
  build). Its CPU build has none: there a park stops the engine and a wake starts it again.

Each row is a class of the ``EngineKind`` protocol, so that another kind is one more row, and nothing of the switch
asks which kind a model is: this module is the switch's one door to vLLM (its options, its memory numbers, its log
lines, what makes two of its starts profile alike). Torch-free.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import argv
from ..engines.vllm.argcheck import checked
from ..engines.vllm.compile_key import config_digest
from ..engines.vllm.kvpin import KV_BYTES, kv_given, kv_pin, kv_profiled
from ..errors import CheckpointError
from ..loading.checkpoint import open_checkpoint
from ..engines.vllm.options import LAYOUT_PREFIX, LOAD_FORMAT
from ..engines.vllm.preload import SERVER_PRELOAD_ENV
from ..engines.vllm.start import EXTRA_CONFIG, LOAD_FORMAT_OPTION, TENSOR_PARALLEL, VllmStart, is_cpu_build
from ..rows import EntryRow
from ..engines.vllm.standby import SPEC as STANDBY
from ..standby import handoff
from ..standby.handoff import IMPORT_ENV
from .memory import CONTEXT_MIB, GpuNeed

SLEEP_MODE = argv.Option(("--enable-sleep-mode",), "none")
EAGER = argv.Option(("--enforce-eager",), "none")
COMPILED_LINE = "torch.compile took "  # vLLM's, once its compile (or its load from the cache) has ended
MAX_SEQS = argv.Option(("--max-num-seqs",))
BATCHED_TOKENS = argv.Option(("--max-num-batched-tokens",))
DEVICE = argv.Option(("--device",))
GPU_SHARE = argv.Option(("--gpu-memory-utilization",))
VLLM_SHARE = 0.92  # vLLM 0.26's default --gpu-memory-utilization
VLLM_MAX_SEQS = 1024  # vLLM 0.26's default --max-num-seqs on an H200
VLLM_GRAPHS_MIB = 1024  # its CUDA graphs at the default sizes (51, batches up to 512), 8B
VLLM_MAX_GRAPH_BATCH = 512
VLLM_SCRATCH_MIB = 3072  # a vLLM preload's context, activations of its profile run and CUDA graphs (8B: ~2.5 GiB)
VLLM_BATCHED_TOKENS = 8192  # vLLM 0.26's default --max-num-batched-tokens (its API server, a GPU of 70 GiB or more)
VLLM_ACTIVATIONS_MIB = 3584  # a vLLM engine's activations at that many tokens a step, and 1 MiB a sequence
ARGCHECK_S = 120.0  # vLLM's parser imported (5 s on 2 busy cores): a check that takes longer refuses nothing
FEWER_SEQS = ("--max-num-seqs", "32")  # what the fit's hint suggests: measured on an H200 (fill10_seven_2026-12-05)
FEWER_TOKENS = ("--max-num-batched-tokens", "2048")  # and this: a step's activations a quarter of the default's
Command = tuple[list[str], dict[str, str]]  # a server's argv, and what it adds to the environment


def weights_mib(checkpoint: os.PathLike[str] | str) -> int:
    """The checkpoint's shards, in MiB (their tensors as stored: a dtype cast is not counted); 0 where it cannot be
    read (its preload says why)."""
    try:
        return open_checkpoint(checkpoint, validate=False).nbytes >> 20
    except (OSError, CheckpointError):
        return 0


class Spec(Protocol):
    """What a kind reads of a model (``config.ModelConfig`` is one; the config checks a model with its kind, so the
    kinds cannot import it)."""

    @property
    def name(self) -> str: ...
    @property
    def checkpoint(self) -> Path: ...
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...


class EngineKind(Protocol):
    """An engine kind: everything the switch knows of it (a row of ``KINDS``)."""

    @property
    def name(self) -> str: ...
    @property
    def parked_mib(self) -> int: ...  # what a parked engine keeps on its GPU, read on an H200 (8B, CUDA graphs)
    @property
    def deepens_when_idle(self) -> bool: ...  # a parked engine idle past deep_park_after_s parks deeper (level 2)
    @property
    def engine_layout(self) -> bool: ...  # its preload publishes the engine's layout (per rank), not the checkpoint's
    @property
    def keeps_standbys(self) -> bool: ...  # its starts go through warm standbys (``standby/handoff.py``)
    @property
    def keeps_kv(self) -> bool: ...  # its park keeps the generations in flight, paused with their KV caches
    @property
    def moves_kv_to_host(self) -> bool: ...  # and can move their KV caches to pinned host memory meanwhile
    def ranks_of(self, args: Sequence[str]) -> int: ...
    def reads_checkpoint_itself(self, args: Sequence[str]) -> bool: ...
    def parks(self, parking: bool) -> bool: ...
    def command(self, m: Spec, port: int, parks: bool) -> Command: ...
    def refused(self, models: Sequence[Spec]) -> dict[str, str]: ...
    def not_preloaded(self, m: Spec) -> str: ...
    def compile_ahead_command(self, m: Spec, port: int, parks: bool, total_mib: int) -> Command | None: ...
    def kv_profiled(self, log: str) -> int | None: ...
    def compiled_in(self, m: Spec, log: str) -> bool: ...
    def with_kv(self, args: Sequence[str], nbytes: int) -> tuple[str, ...]: ...
    def same_profile(self, m: Spec, other: Spec) -> bool: ...
    def fewer_seqs(self, args: Sequence[str]) -> tuple[str, ...]: ...
    def preload_command(self, m: Spec, parks: bool) -> list[str]: ...
    def preload_dtype(self, m: Spec) -> str: ...
    def owns(self, row: EntryRow, m: Spec) -> bool: ...
    def ranks(self, m: Spec) -> int: ...
    def gpu_need(self, m: Spec) -> GpuNeed: ...
    def standbys(self, directory: Path) -> list[int]: ...
    def retire_standbys(self, directory: Path) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class HotweightsKind:
    """The embedded engine, ``hotweights serve``."""

    name: str = "hotweights"
    parked_mib: int = 900  # 712-892 MiB read parked (context, kernels)
    deepens_when_idle: bool = True
    engine_layout: bool = False
    keeps_standbys: bool = False
    keeps_kv: bool = True  # /sleep?mode=keep (serve/park.py)
    moves_kv_to_host: bool = False  # its KV cache stays where the generation left it

    def ranks_of(self, args: Sequence[str]) -> int:
        """The tensor parallelism its ``args`` ask for (ValueError where they are malformed)."""
        return 1

    def reads_checkpoint_itself(self, args: Sequence[str]) -> bool:
        """Whether its ``args`` make the engine read the checkpoint itself (then it may be of other formats than
        safetensors, and nothing is preloaded)."""
        return False

    def parks(self, parking: bool) -> bool:
        """Whether its engines park (else a park stops them and a wake starts them again)."""
        return parking

    def command(self, m: Spec, port: int, parks: bool) -> Command:
        """Its server's command on ``127.0.0.1:port``, and what it adds to the environment."""
        return [sys.executable, "-m", "hotweights", "serve", *_common(m, port), *m.args], {}

    def refused(self, models: Sequence[Spec]) -> dict[str, str]:
        """What its engine's own argument parser refuses of each model's ``args``, in one line ({name: line}), before
        any engine starts (``hotweights serve``'s parser, in this process)."""
        import argparse

        from .. import cli_engine
        from ..cli_parser import build_parser

        commands = next(a for a in build_parser(cli_engine.register)._actions
                        if isinstance(a, argparse._SubParsersAction))
        serve = commands.choices["serve"]
        said = {m.name: argv.refused(serve, [str(m.checkpoint), *m.args], "hotweights serve") for m in models}
        return {name: line for name, line in said.items() if line}

    def not_preloaded(self, m: Spec) -> str:
        """Why this model has nothing to preload ("" when it has)."""
        return ""

    def compile_ahead_command(self, m: Spec, port: int, parks: bool, total_mib: int) -> Command | None:
        """A server that compiles what the model's first start would, without its weights, so that it runs beside
        the preload (``switch/startup.py``); None where the first start compiles nothing or its preload does."""
        return None

    def kv_profiled(self, log: str) -> int | None:
        """The KV cache (bytes per GPU) a start whose output is ``log`` sized from a profile of the GPU's memory;
        None where it says none."""
        return None

    def compiled_in(self, m: Spec, log: str) -> bool:
        """Whether a start whose output so far is ``log`` has compiled what it compiles (a start of the same config
        beside it from now on loads that code instead of compiling it again); False where it cannot tell."""
        return False

    def with_kv(self, args: Sequence[str], nbytes: int) -> tuple[str, ...]:
        """``args`` with a KV cache of ``nbytes`` per GPU pinned (nothing profiled at start)."""
        return tuple(args)

    def same_profile(self, m: Spec, other: Spec) -> bool:
        """Whether starts of ``m`` and ``other`` would size the same KV cache from a profile of the GPU's memory
        (``Engine.pin_kv_as``): its engine profiles nothing."""
        return False

    def fewer_seqs(self, args: Sequence[str]) -> tuple[str, ...]:
        """What to add to ``args`` for an engine that keeps less on its GPU while parked (the fit's hint), () where
        nothing would."""
        return ()

    def standbys(self, directory: Path) -> list[int]:
        """The pids of this kind's warm standbys in ``directory`` (the keeper's): none, it keeps none."""
        return []

    def retire_standbys(self, directory: Path) -> list[int]:
        """Retire this kind's warm standbys in ``directory``, returning once they are gone; their pids."""
        return []

    def preload_command(self, m: Spec, parks: bool) -> list[str]:
        """``hotweights preload ...`` for it (the CLI's arguments)."""
        picked = {name: argv.Option((name,)).value(m.args) for name in ("--device", "--dtype")}
        return ["preload", "--model", str(m.checkpoint), *[x for name, v in picked.items() if v for x in (name, v)]]

    def preload_dtype(self, m: Spec) -> str:
        """The dtype its preload publishes (the checkpoint's own by default, as the preload's ``auto``)."""
        return _dtype(m)

    def owns(self, row: EntryRow, m: Spec) -> bool:
        """Whether a keeper entry holds this model's weights as its engine maps them."""
        return row.model == m.checkpoint.name

    def ranks(self, m: Spec) -> int:
        return 1

    def gpu_need(self, m: Spec) -> GpuNeed:
        """What its preload and start take on the GPUs (none for an engine on the CPU)."""
        device = DEVICE.value(m.args) or "cpu"
        if not device.startswith("cuda"):
            return GpuNeed(())
        index = int(device.partition(":")[2] or 0)
        return GpuNeed(m.gpus[index:index + 1] if m.gpus else (index,), 0.0, weights_mib(m.checkpoint), CONTEXT_MIB,
                       parked_mib=self.parked_mib)


@dataclass(frozen=True, slots=True)
class VllmKind:
    """vLLM, ``hotweights vllm serve`` (from a warm standby)."""

    name: str = "vllm"
    parked_mib: int = 1950  # 1,898-1,912 MiB read parked (context 0.6 GiB, graphs 1.0)
    deepens_when_idle: bool = False
    engine_layout: bool = True
    keeps_standbys: bool = True
    keeps_kv: bool = True  # /pause?mode=keep + hotweights_hold (engines/vllm/park.py; vLLM's own sleep drops it)
    moves_kv_to_host: bool = True  # hotweights_hold's kv="host": its sleep-mode allocator offloads the KV cache

    def ranks_of(self, args: Sequence[str]) -> int:
        return VllmStart.parse(list(args)).tensor_parallel_size

    def reads_checkpoint_itself(self, args: Sequence[str]) -> bool:
        return VllmStart.parse(list(args)).load_format not in (None, LOAD_FORMAT)

    def parks(self, parking: bool) -> bool:
        return parking and not is_cpu_build()

    def command(self, m: Spec, port: int, parks: bool) -> Command:
        return self._serve(m, m.args, port, parks)

    def refused(self, models: Sequence[Spec]) -> dict[str, str]:
        """vLLM's own parser over each model's ``args``, and on its CPU build whether its attention backend serves
        the model's head size, in one process for all (``engines.vllm.argcheck``: vLLM imported, no CUDA; each
        verdict kept, so a front started again on the same config asks nothing of vLLM). Where that process cannot
        say (no vLLM here: the start says so), nothing is refused."""
        if not models:
            return {}
        return checked([{"name": m.name, "args": list(m.args), "checkpoint": str(m.checkpoint)} for m in models],
                       ARGCHECK_S)

    def _serve(self, m: Spec, args: Sequence[str], port: int, parks: bool) -> Command:
        cmd = [sys.executable, "-m", "hotweights", "vllm", "serve", *_common(m, port), *args]
        if VllmStart.parse(list(args)).load_format is None:  # the engine layout the preload made, zero-copy
            cmd += ["--load-format", LOAD_FORMAT]
        # the next start's standby imports beside this one: the switch's starts follow one another, and each
        # waited ~20 s for the standby the one before prepared once it was ready (H200, ten 8B, 2026-12-04)
        env = {IMPORT_ENV: "now", **({"VLLM_SERVER_DEV_MODE": "1"} if parks else {})}
        return cmd + _sleep_mode(m, parks), env

    def kv_profiled(self, log: str) -> int | None:
        return kv_profiled(log)

    def compiled_in(self, m: Spec, log: str) -> bool:
        """vLLM 0.26 logs ``torch.compile took N s in total`` once its compile has ended and its compile cache is
        saved (``compilation/monitor.py``; a start that loaded the code from the cache logs it too); a start with
        ``--enforce-eager`` compiles nothing."""
        return EAGER.present(m.args) or COMPILED_LINE in log

    def with_kv(self, args: Sequence[str], nbytes: int) -> tuple[str, ...]:
        return (*KV_BYTES.strip(args), "--kv-cache-memory-bytes", str(nbytes))

    def same_profile(self, m: Spec, other: Spec) -> bool:
        """vLLM's profile gives two starts the same KV cache where their arguments, GPUs, config files and weights'
        size are the same (the caller compares their GPU needs)."""
        if (m.args, m.gpus) != (other.args, other.gpus):
            return False
        digest = config_digest(str(m.checkpoint))
        return digest is not None and digest == config_digest(str(other.checkpoint))

    def standbys(self, directory: Path) -> list[int]:
        return handoff.holders(STANDBY, directory)

    def retire_standbys(self, directory: Path) -> list[int]:
        return handoff.stop(STANDBY, directory)

    def fewer_seqs(self, args: Sequence[str]) -> tuple[str, ...]:
        """``--max-num-seqs 32`` where ``args`` set neither it nor ``--enforce-eager`` (vLLM's CUDA graphs, which
        stay on the GPU while it is parked, then cover batches of up to 64), ``--max-num-batched-tokens 2048`` where
        they do not set it (an awake engine's activations then a quarter of the default's)."""
        seqs = () if MAX_SEQS.present(args) or EAGER.present(args) else FEWER_SEQS
        return seqs + (() if BATCHED_TOKENS.present(args) else FEWER_TOKENS)

    def not_preloaded(self, m: Spec) -> str:
        chosen = VllmStart.parse(list(m.args)).load_format or LOAD_FORMAT
        return "" if chosen == LOAD_FORMAT else f"--load-format {chosen}: vLLM reads the checkpoint"

    def preload_dtype(self, m: Spec) -> str:
        return _dtype(m)

    def compile_ahead_command(self, m: Spec, port: int, parks: bool, total_mib: int) -> Command | None:
        """The model's start as it will run, with ``--load-format dummy`` (random weights made on the GPU: no read,
        no keeper) and a KV cache of one ``--max-model-len`` sequence that it is not profiled for
        (``--kv-cache-memory-bytes``, so that it runs beside the preload, ``kvpin.py``), within a
        ``--gpu-memory-utilization`` of what it takes. vLLM's compile-cache key holds none of the three (vLLM 0.26:
        ``LoadConfig.compute_hash`` has no factor, ``CacheConfig.compute_hash`` ignores the other two), so what it
        compiles (torch.compile's code, its sampler's Triton kernels) is what the start finds. None where the
        start compiles nothing (``--enforce-eager``, the CPU build), or the preload is a whole vLLM start that
        compiled already (several ranks; ``HOTWEIGHTS_VLLM_SERVER_PRELOAD=1``), or the KV cache of one sequence
        cannot be told from ``config.json``."""
        if (is_cpu_build() or EAGER.present(m.args) or self.not_preloaded(m) or self.ranks(m) != 1
                or os.environ.get(SERVER_PRELOAD_ENV, "") == "1" or total_mib <= 0):
            return None
        own = argv.strip(m.args, LOAD_FORMAT_OPTION, EXTRA_CONFIG, KV_BYTES, GPU_SHARE)
        pin = kv_pin(m.checkpoint, own)
        if pin is None:
            return None
        share = math.ceil(100 * self.gpu_need(m).ahead_mib / total_mib) / 100
        args = [*own, "--load-format", "dummy", "--kv-cache-memory-bytes", str(pin),
                "--gpu-memory-utilization", f"{min(share, 0.95):.2f}"]
        return self._serve(m, args, port, parks)

    def preload_command(self, m: Spec, parks: bool) -> list[str]:
        """With the engine's own flags (the load format's aside), so that what the preload's vLLM compiles is
        what the first start finds cached; ``--enable-sleep-mode`` with them, as it is in vLLM's compile-cache
        key (without it each parking engine's first start compiled again: 23-31 s on an H200). The tensor
        parallelism is the preload's own flag: it waits for an entry of every rank."""
        own = argv.strip(m.args, LOAD_FORMAT_OPTION, EXTRA_CONFIG, TENSOR_PARALLEL)
        return ["preload", "--engine", "vllm", "--model", str(m.checkpoint), "--tensor-parallel-size",
                str(self.ranks(m)), *[f"--vllm-arg={a}" for a in own + _sleep_mode(m, parks)]]

    def owns(self, row: EntryRow, m: Spec) -> bool:
        return row.model == m.checkpoint.name and row.layout.startswith(LAYOUT_PREFIX)

    def ranks(self, m: Spec) -> int:
        return self.ranks_of(m.args)  # the config checked them

    def gpu_need(self, m: Spec) -> GpuNeed:
        if is_cpu_build():
            return GpuNeed(())
        ranks = self.ranks(m)
        try:
            share = float(GPU_SHARE.value(m.args) or VLLM_SHARE)
        except ValueError:  # vLLM refuses the start itself, in its own words
            share = VLLM_SHARE
        given = kv_given(m.args) or 0
        pinned = given or kv_pin(m.checkpoint, argv.strip(m.args, TENSOR_PARALLEL), ranks) or 0
        parked, activations = self.engine_mib(m.args)
        loader_only = ranks == 1 and os.environ.get(SERVER_PRELOAD_ENV, "") != "1"  # ``preload.preload_vllm``
        return GpuNeed(m.gpus[:ranks] or tuple(range(ranks)), share, weights_mib(m.checkpoint) // ranks,
                       kv_mib=pinned >> 20, parked_mib=parked, engine_kv_mib=given >> 20,
                       activations_mib=activations, loader_only=loader_only, scratch_mib=VLLM_SCRATCH_MIB)

    def engine_mib(self, args: Sequence[str]) -> tuple[int, int]:
        """What an engine started with ``args`` keeps on its GPU parked, and its activations beside a pinned KV
        cache, in MiB. vLLM 0.26 captures CUDA graphs for batches of up to twice ``--max-num-seqs`` (at most 512),
        and none with ``--enforce-eager``; its sampler's buffers grow with ``--max-num-seqs`` too. Read on an H200
        (8B, 2026-12-05, ``gpu_load/fill10_seven_2026-12-05.json``): parked 1,902 MiB at the defaults, 976 MiB with
        ``--max-num-seqs 32``; awake less parked less its 2 GiB KV cache, 1,690 MiB and 106-318 MiB early on, but
        after a minute of prompts of up to 2,000 tokens on an H100 1,102-3,188 MiB (torch's cache at its peak: 8,192
        tokens a step; 1 GiB counted, an engine beside it ran out of memory: ``fill5kv_h100_2026-12-06d.json``).
        Estimates above both: the graphs in proportion to the largest batch captured (``parked_mib`` holds them
        whole); activations in proportion to the tokens a step (``--max-num-batched-tokens``), and 1 MiB a sequence."""
        seqs, tokens = VLLM_MAX_SEQS, VLLM_BATCHED_TOKENS
        try:
            seqs = max(1, int(MAX_SEQS.value(args) or seqs))
            tokens = max(1, int(BATCHED_TOKENS.value(args) or tokens))
        except ValueError:  # vLLM refuses the start itself, in its own words
            pass
        batch = 0 if EAGER.present(args) else min(2 * seqs, VLLM_MAX_GRAPH_BATCH)  # the largest captured
        graphs = VLLM_GRAPHS_MIB * batch // VLLM_MAX_GRAPH_BATCH
        activations = max(512, VLLM_ACTIVATIONS_MIB * tokens // VLLM_BATCHED_TOKENS) + min(seqs, VLLM_MAX_SEQS)
        return self.parked_mib - VLLM_GRAPHS_MIB + graphs, activations


def _common(m: Spec, port: int) -> list[str]:
    return [str(m.checkpoint), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", m.name]


def _sleep_mode(m: Spec, parks: bool) -> list[str]:
    return ["--enable-sleep-mode"] if parks and not SLEEP_MODE.present(m.args) else []


def _dtype(m: Spec) -> str:
    return argv.Option(("--dtype",)).value(m.args) or "auto"


KINDS: dict[str, EngineKind] = {kind.name: kind for kind in (HotweightsKind(), VllmKind())}
