"""The GPU memory budget with weights that live outside the engine.

vLLM asks for ``--gpu-memory-utilization`` x total memory and refuses to start when less
is free. Weights the daemon holds on the GPU are not free, yet a zero-copy engine maps
them instead of allocating its own: they are the engine's weights, counted once. So the
engine's own budget is ``requested - external`` and only that must be free; the KV cache
then gets what a disk start gets (budget minus weights minus activations).

vLLM versions with ``get_external_weight_memory`` do this themselves. For the others,
``request`` (installed around vLLM's ``request_memory`` by ``patches.install_budget``)
applies the same arithmetic (``engine_budget``) and, when a start cannot fit, adds one line saying what
the cache holds and what to set. What engines parked on the entry this start maps still hold on the GPU (the
keeper lists them per entry) is counted as the mapped weights are: the same model's engines, a start beside its
parked predecessor, share one util x total. Engines parked on other entries are other models with shares of
their own: what they hold is simply not free (``hotweights switch``'s ten 8B models on an H200: counted here, four
parked engines' 7.44 GiB left a 0.17 share 1.07 GiB and no KV cache). Runs in vLLM's GPU worker.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...evidence import GIB
from ...rows import EntryRow

logger = logging.getLogger(__name__)


def engine_share(total: int, utilization: float, external: int) -> int:
    """What an engine allocates itself of ``utilization`` x ``total``, ``external`` (its mapped weights) counted
    towards it; in any unit (bytes here, MiB in the switch's memory model, ``switch/memory.py``). vLLM-free."""
    return math.ceil(total * utilization) - external


def engine_budget(*, total: int, free: int, utilization: float, external: int) -> tuple[int, str]:
    """``(bytes the engine may allocate, '')``, or ``(0, why it cannot start)``.

    ``external``: bytes of weights this engine maps from the cache (0 for a disk start).
    """
    requested = math.ceil(total * utilization)
    engine = engine_share(total, utilization, external)
    if engine <= 0:
        return 0, (f"the mapped weights ({external / GIB:.2f} GiB) exceed the --gpu-memory-utilization budget "
                   f"({utilization}, {requested / GIB:.2f} GiB); raise --gpu-memory-utilization")
    if free < engine:
        return 0, (f"{free / GIB:.2f} GiB is free but the engine needs {engine / GIB:.2f} GiB "
                   f"(--gpu-memory-utilization {utilization} x {total / GIB:.2f} GiB"
                   + (f" minus {external / GIB:.2f} GiB of mapped weights" if external else "") + ")")
    return engine, ""


def fitting_utilization(*, total: int, free: int, external: int, margin: float = 0.01) -> float:
    """The largest --gpu-memory-utilization a start can use with ``free`` bytes free."""
    return max(0.0, math.floor(((free + external) / total - margin) * 100) / 100)


def cache_hint(*, total: int, free: int, held: int, unmapped: str, hotweights: bool) -> str:
    """What to set when a start that maps nothing cannot fit beside ``held`` bytes of cached weights;
    ``unmapped`` says why it maps nothing (a disk start, a copy, or the daemon's reason);
    ``hotweights``: the start already uses ``--load-format hotweights``."""
    switch = "" if hotweights else "start with --load-format hotweights (zero-copy weights count as this engine's), or "
    return (f"; the weight cache holds {held / GIB:.2f} GiB on this GPU and {unmapped}: {switch}"
            f"--gpu-memory-utilization {fitting_utilization(total=total, free=free, external=0)}, "
            f"or `hotweights release`")


starting: list[Any] = []  # the vllm_config of the worker whose device is being set up (patches)


def request(original: Any, init_snapshot: Any, cache_config: Any, *args: Any, takes_external: bool,
            **kwargs: Any) -> int:
    """vLLM's ``request_memory`` (``original``) with the mapped weights counted as this engine's.

    Where vLLM takes no external weights, applies ``engine_budget`` with the bytes this worker
    will map; everywhere, a start that cannot fit while the cache holds memory on the GPU gets
    one more sentence: what the cache holds and what to set.
    """
    view = _cache_view(starting[-1] if starting else None)
    if view.refusal:  # no entry can serve this strict start: it fails on that, not on the budget
        raise ValueError(view.refusal)
    mapped = view.mapped
    total, free = int(init_snapshot.total_memory), int(init_snapshot.free_memory)
    hint = (cache_hint(total=total, free=free, held=view.held, unmapped=view.unmapped, hotweights=view.hotweights)
            if view.held and not mapped else "")
    if takes_external:
        try:
            return int(original(init_snapshot, cache_config, *args, **kwargs))
        except ValueError as exc:
            raise ValueError(f"{exc}{hint}") from None
    utilization = float(cache_config.gpu_memory_utilization)
    engine, problem = engine_budget(total=total, free=free, utilization=utilization, external=mapped + view.parked)
    if problem:
        parked = f" ({view.parked / GIB:.2f} GiB of it held by parked engines)" if view.parked else ""
        raise ValueError(f"hotweights: cannot start within the GPU budget: {problem}{parked}{hint}")
    if mapped or view.parked:
        logger.info("GPU budget: %.2f GiB (--gpu-memory-utilization %s), of which %.2f GiB are the mapped "
                    "weights, %.2f GiB held by parked engines, %.2f GiB for the engine's own allocations",
                    math.ceil(total * utilization) / GIB, utilization, mapped / GIB, view.parked / GIB, engine / GIB)
    return engine


def parked_on_entry(rows: Iterable[EntryRow], key_short: str) -> int:
    """Bytes the engines parked on the entry ``key_short`` hold of their own (status rows): a start that maps that
    entry counts them in its share; engines parked on other entries are not its share's."""
    return sum(r.parked_bytes for r in rows if r.key == key_short)


@dataclass(frozen=True, slots=True)
class CacheView:
    """What the cache means for one worker's budget."""

    mapped: int = 0  # bytes this worker maps zero-copy
    held: int = 0  # bytes the cache holds on its GPU
    unmapped: str = ""  # why this start maps none of them (for the hint when it cannot fit)
    refusal: str = ""  # the strict message, when no entry can serve a strict start
    hotweights: bool = False  # the start uses --load-format hotweights
    parked: int = 0  # bytes engines parked on the entry this start maps hold of their own (in this start's budget)


def _cache_view(vllm_config: Any) -> CacheView:
    """One connection to the daemon: what it holds on this GPU, the size of the entry this worker maps (a
    lookup: no fds, not an attach), and, when it maps none, why."""
    if vllm_config is None:
        return CacheView()
    from ...client import connect_for
    from ...config import AttachConfig
    from ...errors import HotweightsError
    from ...pools.devices import resolve_device
    from .options import LOAD_FORMAT, split_extra_config

    load_config = vllm_config.load_config
    try:
        hotweights = load_config.load_format == LOAD_FORMAT
        layout, config = split_extra_config(load_config.model_loader_extra_config) if hotweights else \
            ("auto", AttachConfig())
        keys = None
        if hotweights:
            from .keys import keys_for

            keys = keys_for(vllm_config, config)
        with connect_for(config) as client:
            status, device = client.status(), resolve_device("cuda").pool_device
            held = int(status.bytes_by_device.get(device, 0))
            mapped = _mapped_bytes(client, keys.engine, config, layout) if keys is not None and held else 0
            parked = parked_on_entry(status.rows(), keys.engine.short) if mapped and keys is not None else 0
            unmapped, refusal = "this start reads the checkpoint from disk", ""
            if keys is not None and held and not mapped:
                try:
                    from . import capabilities
                    from .keys import candidates

                    found, skipped = candidates(keys, layout, capabilities.detect(),
                                                getattr(vllm_config.model_config, "quantization", None))
                    unmapped, refusal = _why_unmapped(found, skipped, config, client)
                except Exception as exc:  # never block a start on explaining it; the loader decides
                    logger.warning("cannot tell why this start maps no cached weights: %s", exc)
                    unmapped = "this start maps none of it"
            return CacheView(mapped, held, unmapped, refusal, hotweights, parked)
    except (HotweightsError, OSError, ValueError):
        return CacheView()


def _mapped_bytes(client: Any, key: Any, config: Any, layout: str) -> int:
    from .keys import maps_zero_copy

    return client.lookup(key).nbytes if maps_zero_copy(config, layout) else 0


def _why_unmapped(candidates: list[Any], skipped: list[str], config: Any, client: Any) -> tuple[str, str]:
    """``(why a --load-format hotweights start maps nothing of what the cache holds, the strict message
    if it is a strict start that no entry can serve)``: its ``candidates`` asked by lookups."""
    from ...loading.diagnosis import diagnose

    found = diagnose(candidates, lambda cand, _: client.lookup(cand.key), skipped=skipped)
    if found.served is not None:
        entry = f"the {found.served.label} entry"
        if config.mode != "zero_copy":
            return f"this start maps none of it (mode={config.mode} copies {entry})", ""
        return f"this start maps none of it ({entry} is streamed into vLLM's loaders, a copy)", ""
    if not config.fallback:
        return "", found.strict_message()
    return f"this start maps none of it ({found.reason}; it will load from disk)", ""
