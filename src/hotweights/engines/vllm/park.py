"""Parking a vLLM engine whose weights are the keeper's: vLLM's own sleep, plus what only we can do.

Runs in each vLLM GPU worker (``patches.install_park`` wraps ``Worker.sleep`` and ``Worker.wake_up``).
vLLM's sleep frees what its own allocator holds (level 1 offloads its "weights" tag to host memory, level
2 discards it; the KV cache goes at both). Zero-copy weights are not in that allocator, so vLLM leaves
them mapped; on top of it:

- level 1 keeps them mapped (nothing copied; the keeper's entry stays shared);
- level 2 unmaps them at their addresses (``loading.resident``), and a wake maps the same key there again
  (from the keeper's GPU entry, else from its host copy, published back) before vLLM wakes the rest, so
  the CUDA graphs that captured their pointers replay as before. vLLM's level 2 wake leaves the weights
  it discarded for the caller to load again; ours come back by themselves.

vLLM's level-2 sleep also keeps the model's buffers (``Worker._sleep_saved_buffers``: an 8B's 145, the attention
layers' scales and the rotary cache) in pageable host memory, and its wake copies each back with a blocking
``copy_``: 145 waits for the GPU. On an H200 beside other busy engines that took 0.36 s median, in steps of
about 0.35 s up to 2.0 s, as long as the weights themselves (``benchmarks/results/gpu_load/
fill10_eight_2026-12-05b.json``); one plausible cause is each wait queueing for the GPU behind the other
processes' work. Here the park pins them (``_pin_saved_buffers``), and the wake takes them from vLLM, lets it
wake the rest, then copies all back asynchronously and waits once (``_restore_buffers``). Not yet run on a GPU.

A park that keeps the KV cache (issue 69; ``hold``/``release``, which ``install_park`` adds to vLLM's ``Worker`` as
``hotweights_hold``/``hotweights_release`` for ``POST /collective_rpc``): with the engine's scheduler paused and its
requests kept (``POST /pause?mode=keep``), ``hold`` unmaps only the zero-copy weights (level 2) and calls none of
vLLM's sleep, so the KV cache, the CUDA graphs and the requests in flight stay where they are; ``release`` maps the
weights again at their addresses, and ``POST /resume`` lets the requests go on from their next token: no prefill
again. Only the weights' memory is given back (an 8B's 15.3 GiB, its 2 GiB of KV cache kept), unless ``hold`` is
asked to move the KV cache to pinned host memory (``kv = "host"``: vLLM's allocator offloads it and releases its
blocks; ``release`` maps them back at their addresses and copies it in before ``/resume``): on an H100, 2.06 GiB
in 0.05 s a park, the wake 0.05 s longer (``benchmarks/results/gpu_kv/fill5kv_h100_2026-12-06c.json``).

A wake that cannot fit is refused before anything is mapped or allocated: the GPU must have free what
the park freed (minus the weights, unless they must come from the host copy into new memory). The keeper
is told of each park and wake with what this worker still holds on its GPU (``Park``): a start beside a
parked engine counts it (``budget.py``). Evidence: ``evidence.parked`` and ``evidence.woke`` per worker.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from ... import evidence
from ...loading import resident

logger = logging.getLogger(__name__)
PROFILE_WAKE_ENV = "HOTWEIGHTS_PROFILE_WAKE"  # "1": vLLM's own wake_up profiled into the log (``_profiled``)


def _name(worker: Any) -> str:
    model_config = worker.vllm_config.model_config
    served = getattr(model_config, "served_model_name", None)
    name = served[0] if isinstance(served, (list, tuple)) and served else served or model_config.model
    rank = getattr(worker, "rank", 0)
    return f"{name}" + (f"[rank {rank}]" if worker.vllm_config.parallel_config.world_size > 1 else "")


def sleep(worker: Any, original: Any, level: int = 1) -> Any:
    start = time.perf_counter()
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    result = original(worker, level)
    _pin_saved_buffers(worker)
    unmapped = resident.unmap_all() if level == 2 and resident.held() else 0
    torch.cuda.synchronize()
    freed = max(0, torch.cuda.mem_get_info()[0] - free_before)
    worker._hotweights_parked = (level, max(0, freed - unmapped), unmapped)
    logger.info(evidence.parked(_name(worker), level, freed, time.perf_counter() - start,
                                weights_mapped=not unmapped))
    if resident.held():
        from ...pools.devices import process_gpu_bytes

        resident.announce(level, process_gpu_bytes(torch.cuda.current_device()))
    return result


def wake_up(worker: Any, original: Any, tags: list[str] | None = None) -> Any:
    start = time.perf_counter()
    level, own, unmapped = getattr(worker, "_hotweights_parked", (0, 0, 0))
    weights = tags is None or "weights" in tags
    again = None
    if level:
        _check_fits(worker, own if (tags is None or "kv_cache" in tags) else 0, unmapped if weights else 0)
    checked = time.perf_counter()
    if weights and any(not h.mapped for h in resident.held()):
        again = resident.map_again()  # WeightsGone: nothing was mapped or allocated; it stays parked
    mapped = time.perf_counter()
    saved, worker._sleep_saved_buffers = getattr(worker, "_sleep_saved_buffers", None) or {}, {}
    try:
        result = (_profiled(original, worker, tags) if level and os.environ.get(PROFILE_WAKE_ENV)
                  else original(worker, tags))
    except BaseException:
        worker._sleep_saved_buffers = saved  # still vLLM's to put back, on the wake that succeeds
        raise
    if weights:
        _restore_buffers(worker, saved)
    else:  # their memory sleeps on (a wake of the KV cache alone): for the wake of the weights
        worker._sleep_saved_buffers = saved
    if level:  # where a wake's time goes (issue 55: a wake from host memory at the PCIe floor)
        logger.info("hotweights: the wake of %s: room check %.3f s, weights %.3f s, vLLM's own wake_up %.3f s",
                    _name(worker), checked - start, mapped - checked, time.perf_counter() - mapped)
    if tags is None or ("weights" in tags and "kv_cache" in tags):
        worker._hotweights_parked = (0, 0, 0)
    logger.info(evidence.woke(_name(worker), time.perf_counter() - start, again.source if again else None,
                              again.rate() if again else ""))
    if resident.held() and not getattr(worker, "_hotweights_parked", (0,))[0]:
        resident.announce(0, 0)
    return result


def hold(worker: Any, level: str | int = 2, kv: str = "gpu") -> dict[str, Any]:
    """Park keeping the KV cache, the scheduler paused beforehand with its requests kept: at level 2 the zero-copy
    weights are unmapped at their addresses; with ``kv = "host"`` the KV cache goes to pinned host memory, the GPU
    memory under it given back (``_kv_to_host``); torch's cached activations are given back too, as vLLM's own sleep
    gives them (on an H100 a held engine kept 1.3 GiB of them beside its KV cache, which the switch's estimate left
    out); nothing else changes (see the module's docstring). What it freed."""
    start = time.perf_counter()
    torch.cuda.synchronize()  # the last step's kernels have read the weights
    free_before = torch.cuda.mem_get_info()[0]
    torch.cuda.empty_cache()
    unmapped = resident.unmap_all() if int(level) == 2 and resident.held() else 0
    moved = _kv_to_host() if kv == "host" else 0
    torch.cuda.synchronize()
    freed = max(0, torch.cuda.mem_get_info()[0] - free_before)
    worker._hotweights_parked = (int(level), moved, unmapped)
    kept = f"requests kept, their KV cache in host memory ({moved / 2**30:.2f} GiB)" if moved else \
        "KV cache and requests kept"
    logger.info(evidence.parked(_name(worker), int(level), freed, time.perf_counter() - start,
                                weights_mapped=not unmapped) + f" ({kept})")
    if resident.held():
        from ...pools.devices import process_gpu_bytes

        resident.announce(int(level), process_gpu_bytes(torch.cuda.current_device()))
    return {"freed": freed, "unmapped": unmapped}


def release(worker: Any) -> dict[str, Any]:
    """The wake of ``hold``: the weights mapped again at their addresses (from the keeper's entry, else its host
    copy), refused before anything is mapped where they cannot fit; ``POST /resume`` then lets the kept requests go
    on. Where the weights came from."""
    start = time.perf_counter()
    _level, moved, unmapped = getattr(worker, "_hotweights_parked", (0, 0, 0))
    _check_fits(worker, moved, unmapped)
    again = resident.map_again() if any(not h.mapped for h in resident.held()) else None
    if moved:  # the KV cache back at its addresses (the CUDA graphs replay over it as before)
        from vllm.device_allocator import get_mem_allocator_instance

        get_mem_allocator_instance().wake_up(None)
    worker._hotweights_parked = (0, 0, 0)
    logger.info(evidence.woke(_name(worker), time.perf_counter() - start, again.source if again else None,
                              again.rate() if again else ""))
    if resident.held():
        resident.announce(0, 0)
    return {"source": again.source if again else "kept"}


def _kv_to_host() -> int:
    """The KV cache (vLLM's sleep-mode allocator's ``kv_cache`` tag, and its ``weights`` tag: the few buffers the
    model allocated beside the zero-copy weights) copied to pinned host memory and its GPU memory released, each
    block to be mapped again at the same address by ``wake_up``: vLLM's level-1 sleep with the KV cache offloaded
    too, rather than dropped. Bytes moved; 0 where the allocator holds nothing (vLLM started without sleep mode)."""
    from vllm.device_allocator import get_mem_allocator_instance

    allocator = get_mem_allocator_instance()
    held = sum(d.handle[1] for d in allocator.pointer_to_data.values() if not getattr(d, "is_asleep", False))
    if held:
        allocator.sleep(offload_tags=("weights", "kv_cache"))
    return held


def pin_host(worker: Any) -> dict[str, Any]:
    """The pinned host buffers a held park that moves the KV cache needs (``_kv_to_host``: one per block of the
    allocator's ``weights`` and ``kv_cache`` tags, vLLM's sleep allocating each as it offloads), made once and let go
    into torch's caching host allocator, which keeps them for that park: on an H100 the first such park, which
    made them, took 1.40-1.43 s for 2.06 GiB, the next ones 0.05 s; made ahead (2.70 s, at start-up's park), every
    held park took 0.05-0.07 s, the first included (``gpu_kv/fill5kv_h100_2026-12-06d.json``). Asked after a plain
    park (nothing waits on it); once done, or without CUDA, nothing. Bytes made."""
    if getattr(worker, "_hotweights_pinned", False) or not torch.cuda.is_available():
        return {"pinned": 0}
    from vllm.device_allocator import get_mem_allocator_instance

    start = time.perf_counter()
    sizes = [d.handle[1] for d in get_mem_allocator_instance().pointer_to_data.values()
             if d.tag in ("weights", "kv_cache")]
    try:
        made = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
    except RuntimeError as exc:  # no pinned memory to be had now: the held park makes its own, as before
        logger.warning("hotweights: no pinned host buffers for %s's KV cache ahead of its held parks: %s",
                       _name(worker), exc)
        return {"pinned": 0}
    del made  # into the caching host allocator, each block's size kept for the park that asks for it
    worker._hotweights_pinned = True
    logger.info("hotweights: %s: pinned host buffers for its KV cache in host memory made ahead, %.2f GiB in "
                "%.3f s", _name(worker), sum(sizes) / 2**30, time.perf_counter() - start)
    return {"pinned": sum(sizes)}


def _pin_saved_buffers(worker: Any) -> None:
    """The buffers vLLM's level-2 sleep kept in host memory, pinned (a few MiB), so their wake is one DMA each."""
    saved = getattr(worker, "_sleep_saved_buffers", None)
    if not saved or not torch.cuda.is_available():
        return
    try:
        worker._sleep_saved_buffers = {name: t if t.is_pinned() else t.pin_memory() for name, t in saved.items()}
    except RuntimeError as exc:  # no pinned memory to be had: vLLM's pageable copies still work
        logger.warning("hotweights: the saved buffers of %s stay pageable: %s", _name(worker), exc)


def _restore_buffers(worker: Any, saved: dict[str, torch.Tensor]) -> None:
    """vLLM's buffer restore, all copies queued and one wait (vLLM's waits on each; same buffers, same bytes)."""
    if not saved:
        return
    for name, buffer in worker.model_runner.model.named_buffers():
        if name in saved:
            buffer.data.copy_(saved[name].data, non_blocking=True)
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()


def _profiled(original: Any, worker: Any, tags: list[str] | None) -> Any:
    """vLLM's own wake_up under cProfile, its 12 costliest calls logged (``HOTWEIGHTS_PROFILE_WAKE=1``, a
    diagnostic: on an H200 that wake took 0.012-0.08 s or 0.25-0.70 s, and the slow mode was not understood)."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    result = profile.runcall(original, worker, tags)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(12)
    logger.info("hotweights: vLLM's own wake_up of %s, profiled:\n%s", _name(worker), out.getvalue())
    return result


def _check_fits(worker: Any, own: int, unmapped: int) -> None:
    """Refuse a wake that cannot fit, before anything changes: vLLM takes ``own`` bytes back, and weights
    that come from a host copy take new memory."""
    need = own
    if unmapped:
        from ...client import connect_for

        for h in resident.held():
            if h.mapped:
                continue
            try:
                with connect_for(h.config) as client:
                    if not client.lookup(h.key).nbytes:
                        need += h.manifest.nbytes  # from the host copy: a new allocation
            except Exception:  # map_again says what is wrong with the keeper
                pass
    free = torch.cuda.mem_get_info()[0]
    if need > free:
        raise RuntimeError(f"hotweights: {evidence.cannot_wake_no_room(_name(worker), need, free)}")
