"""Every touch of vLLM's internals, in one place.

Each ``install_*`` is idempotent (a flag on what it wrapped) and logs one line when it
applies: ``vLLM patch applied: <hook>``. Nothing else in hotweights assigns into a vLLM
module or class. ``install`` (called at plugin load) applies the worker hooks when vLLM
imports its worker module, not before: the plugin loads in every vLLM process, and the
API server never imports the worker, so it should not pay for that import either.

- ``install_budget`` wraps ``request_memory`` and ``Worker.init_device`` in
  ``vllm.v1.worker.gpu_worker`` (GPU builds). Why: vLLM asks for
  ``--gpu-memory-utilization`` x total and refuses to start when less is free, and weights
  the daemon holds are not free; the arithmetic is ``budget.request``, the wrap of
  ``init_device`` only carries the worker's ``vllm_config`` into it. Needed by: 0.26
  (``request_memory`` takes no external weight memory: the wrap budgets the mapped
  weights itself); on 0.32 and later the wrap only adds the hint and the strict refusal at
  device set-up. Can go when every supported vLLM takes external weight memory and no
  longer needs to be told why a start that maps nothing does not fit.
- ``keep_cpu_packed_weights`` swaps ``dispatch_cpu_unquantized_gemm`` in
  ``vllm.model_executor.layers.utils`` while a write-through disk load runs (CPU builds,
  0.26 and 0.32): CPU post-processing packs unquantized linear weights into oneDNN
  handles and drops the weight tensors, which write-through must publish. Can go when
  vLLM keeps the unpacked weight or offers a hook. Restored when the load ends.
- ``install_heap_freeze`` wraps ``Worker.load_model`` (``vllm.v1.worker.gpu_worker``; the
  CPU worker inherits it) to ``gc.freeze()`` once before a ``--load-format hotweights``
  load. Why: vLLM's "Model loading took" clock spans full ``gc.collect()`` calls
  (``DeviceMemoryProfiler``), each walking every object vLLM's imports created; a mapped
  model loads in milliseconds, so those walks were most of the weight phase
  (``benchmarks/vllm_load_window.py``). vLLM freezes its heap itself after start-up
  (``freeze_gc_heap``); this does it before loading. Needed by 0.26 and 0.32; can go when
  vLLM freezes before loading.

- ``install_park`` wraps ``Worker.sleep`` and ``Worker.wake_up`` (GPU builds) with ``park.py``. Why:
  vLLM's sleep knows only what its allocator holds; zero-copy weights are outside it, so a deep park
  must unmap them and a wake map them again at the same addresses, and the keeper must know who is
  parked; and its level-2 wake puts the model's buffers back with one blocking copy each (``park.py`` pins
  them and copies them back with one wait; it reads and empties ``Worker._sleep_saved_buffers``). Needed by
  0.26; can go when vLLM offers a sleep hook for external weights.

- ``install_compile_key`` wraps ``vllm.config.utils.get_hash_factors`` (every build, at plugin load) so that a
  ``ModelConfig``'s factor ``model`` is a digest of the checkpoint's config files (``compile_key.py``), not its
  path. Why: the path keys vLLM's compile cache (``torch_compile_cache``, its AOT artifacts), so every model of a
  multi-model box compiled on its first start though all had the same architecture and shapes; what the config
  files say is what the path stood for (the architecture comes from them, not from any other factor).
  ``HOTWEIGHTS_VLLM_COMPILE_KEY=path`` leaves vLLM's key alone. Needed by 0.26 and 0.32; can go when vLLM keys
  its compile cache by the model's configuration.

- ``install_warm_up`` wraps ``Worker.compile_or_warm_up_model`` (GPU builds, and every build with
  ``HOTWEIGHTS_PROFILE_START=1``). Why: vLLM points ``TRITON_CACHE_DIR`` into its compile-cache directory while
  it compiles (``InductorAdaptor.initialize_cache``) and leaves it there, so the compiling start JIT-compiled its
  sampler's Triton kernels into that directory after graph capture, and each start that then loaded the
  compiled code (``TRITON_CACHE_DIR`` untouched: Triton's default cache) compiled them again: 15-21 s after graph
  capture in a cold box's first start and in every start of the batch after it, 0.4-0.6 s in later ones (H200,
  vLLM 0.26, 8B, sampled by ``startprofile``: Triton's ``make_cubin``, ``make_llir`` and its launcher's build,
  ``benchmarks/results/gpu_load/fill10_eight_2026-12-05b.json``). The wrap puts the variable back as the process
  had it before the warm-up, so every start's sampler kernels go to one cache. With
  ``HOTWEIGHTS_PROFILE_START=1`` (a diagnostic) it also samples the warm-up (``startprofile.sampled``). Needed by
  0.26; can go when vLLM restores the variable after compiling.

Not patches, though they run inside vLLM: ``register_model_loader`` (vLLM's own API) and
``preflight.check``, which exits the process at plugin load for a strict start that no
entry can serve.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.abc
import importlib.machinery
import inspect
import logging
import os
import sys
from collections.abc import Callable, Generator, Sequence
from types import ModuleType
from typing import Any

from .options import LOAD_FORMAT

logger = logging.getLogger(__name__)


def _applied(hook: str) -> None:
    logger.info("vLLM patch applied: %s", hook)


WORKER = "vllm.v1.worker.gpu_worker"  # the GPU worker; the CPU worker subclasses its Worker
TRITON_CACHE = "TRITON_CACHE_DIR"  # vLLM's compile moves it into its compile cache (``install_warm_up``)


def install(*, gpu: bool) -> None:
    """The worker hooks this build needs, applied as soon as (or once) vLLM imports its worker; the compile key
    at once."""
    install_compile_key()
    hooks = [install_budget, install_heap_freeze, install_park] if gpu else [install_heap_freeze]
    from . import startprofile

    if gpu or startprofile.wanted():
        hooks.append(install_warm_up)
    if WORKER in sys.modules:
        for hook in hooks:
            hook(sys.modules[WORKER])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(WORKER, hooks))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hooks(module)`` right after ``name`` is first imported (then leaves ``sys.meta_path``)."""

    def __init__(self, name: str, hooks: Sequence[Callable[[ModuleType], bool]]) -> None:
        self.name, self.hooks = name, hooks

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, hooks = spec.loader.exec_module, self.hooks

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            for hook in hooks:
                hook(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def install_budget(worker: ModuleType) -> bool:
    """Wrap the GPU worker's ``request_memory`` with ``budget.request``; True if done now."""
    original = getattr(worker, "request_memory", None)
    if original is None or getattr(original, "_hotweights", False):
        return False
    from . import budget

    takes_external = "external_weight_memory" in inspect.signature(original).parameters
    init_device = worker.Worker.init_device

    @functools.wraps(init_device)
    def record_config(self: Any) -> Any:
        budget.starting.append(self.vllm_config)
        try:
            return init_device(self)
        finally:
            budget.starting.pop()

    @functools.wraps(original)
    def request_memory(init_snapshot: Any, cache_config: Any, *args: Any, **kwargs: Any) -> int:
        return budget.request(original, init_snapshot, cache_config, *args, takes_external=takes_external,
                              **kwargs)

    request_memory._hotweights = True  # type: ignore[attr-defined]
    worker.request_memory = request_memory
    worker.Worker.init_device = record_config
    _applied("request_memory budgets mapped weights" + ("" if takes_external else " (external weights counted here)"))
    return True


def install_heap_freeze(worker: ModuleType) -> bool:
    """Freeze the heap once before a hotweights load; True if installed now."""
    load_model = getattr(worker.Worker, "load_model", None)
    if load_model is None or getattr(load_model, "_hotweights", False):
        return False

    @functools.wraps(load_model)
    def frozen_then_load(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self.vllm_config.load_config, "load_format", None) == LOAD_FORMAT:
            gc.freeze()  # what lives now lives for the engine's life: its import and set-up heap
        return load_model(self, *args, **kwargs)

    frozen_then_load._hotweights = True  # type: ignore[attr-defined]
    worker.Worker.load_model = frozen_then_load
    _applied("heap frozen before Worker.load_model")
    return True


def install_park(worker: ModuleType) -> bool:
    """Wrap ``Worker.sleep`` and ``Worker.wake_up`` with ``park.sleep`` / ``park.wake_up``; True if done now."""
    sleep, wake_up = getattr(worker.Worker, "sleep", None), getattr(worker.Worker, "wake_up", None)
    if sleep is None or wake_up is None or getattr(sleep, "_hotweights", False):
        return False
    from . import park

    @functools.wraps(sleep)
    def parked(self: Any, level: int = 1) -> Any:
        return park.sleep(self, sleep, level)

    @functools.wraps(wake_up)
    def woken(self: Any, tags: list[str] | None = None) -> Any:
        return park.wake_up(self, wake_up, tags)

    parked._hotweights = True  # type: ignore[attr-defined]
    worker.Worker.sleep, worker.Worker.wake_up = parked, woken
    # a park that keeps the KV cache, through POST /collective_rpc once /pause?mode=keep has paused the scheduler
    worker.Worker.hotweights_hold = lambda self, level=2, kv="gpu": park.hold(self, level, kv)
    worker.Worker.hotweights_release = lambda self: park.release(self)
    worker.Worker.hotweights_pin_host = lambda self: park.pin_host(self)
    _applied("Worker.sleep/wake_up park zero-copy weights (level 2 unmaps them at their addresses); "
             "hotweights_hold/release park keeping the KV cache")
    return True


def install_warm_up(worker: ModuleType) -> bool:
    """Wrap ``Worker.compile_or_warm_up_model``: Triton's cache back where this process had it (``TRITON_CACHE_DIR``
    as it was when the worker module was imported), then vLLM's warm-up, sampled where asked; True if done now."""
    original = getattr(worker.Worker, "compile_or_warm_up_model", None)
    if original is None or getattr(original, "_hotweights", False):
        return False
    from . import startprofile

    before = os.environ.get(TRITON_CACHE)  # the engine's own: vLLM sets it only once it compiles

    @functools.wraps(original)
    def warm_up(self: Any) -> Any:
        config = getattr(self, "vllm_config", None)
        name = str(getattr(getattr(config, "model_config", None), "served_model_name", None) or "the model")
        triton_cache_back(before, name)
        if startprofile.wanted():
            return startprofile.sampled(original, self, name)
        return original(self)

    warm_up._hotweights = True  # type: ignore[attr-defined]
    worker.Worker.compile_or_warm_up_model = warm_up
    _applied("Worker.compile_or_warm_up_model puts TRITON_CACHE_DIR back"
             + (" and is sampled (HOTWEIGHTS_PROFILE_START=1)" if startprofile.wanted() else ""))
    return True


def triton_cache_back(before: str | None, name: str) -> None:
    """``TRITON_CACHE_DIR`` as it was (``before``; unset if it was), where vLLM's compile moved it."""
    now = os.environ.get(TRITON_CACHE)
    if now == before:
        return
    if before is None:
        del os.environ[TRITON_CACHE]
    else:
        os.environ[TRITON_CACHE] = before
    logger.info("hotweights: %s's warm-up JIT-compiles its sampler's Triton kernels into %s (Triton's cache the "
                "next starts read), not %s (where vLLM's compile left %s)", name, before or "Triton's default cache",
                now, TRITON_CACHE)


@contextlib.contextmanager
def keep_cpu_packed_weights() -> Generator[dict[int, Any], None, None]:
    """While active, remember each weight vLLM's CPU GEMM dispatch is about to drop.

    Yields ``id(layer) -> weight`` (the tensor as loaded, before oneDNN/sgl packing).
    """
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    kept: dict[int, Any] = {}

    def dispatch(layer: Any, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if remove_weight and weight is not None and not weight.is_meta:
            kept[id(layer)] = weight.data
        original(layer, remove_weight)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch
    _applied("dispatch_cpu_unquantized_gemm keeps the weights it packs (write-through)")
    try:
        yield kept
    finally:
        layer_utils.dispatch_cpu_unquantized_gemm = original


def install_compile_key() -> bool:
    """A model's compile-cache factor from its config files, not its path (``compile_key.py``)."""
    import vllm.config.utils as utils

    from .compile_key import config_digest

    if os.environ.get("HOTWEIGHTS_VLLM_COMPILE_KEY", "config") == "path":
        return False
    original = utils.get_hash_factors
    if getattr(original, "_hotweights", False):
        return False

    @functools.wraps(original)
    def get_hash_factors(config: Any, ignored_factors: set[str]) -> dict[str, object]:
        factors = original(config, ignored_factors)
        if type(config).__name__ == "ModelConfig" and isinstance(factors.get("model"), str):
            digest = config_digest(factors["model"])
            if digest:
                factors["model"] = digest
        return factors

    get_hash_factors._hotweights = True  # type: ignore[attr-defined]
    utils.get_hash_factors = get_hash_factors
    _applied("get_hash_factors keys a model's compile cache by its config files, not its path")
    return True
