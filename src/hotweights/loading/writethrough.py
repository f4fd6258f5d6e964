"""Write-through of an engine's own tensors, one pool at a time.

An engine that loaded from disk publishes the tensors it ended up with (for vLLM: after
``process_weights_after_loading``), so the next start attaches them. Pools are filled
in order; as soon as one is full it is sealed, mapped back read-only and handed to
``repoint`` (the engine swaps its tensor for the view), so the engine's original is
freed before the next pool is written: the peak extra memory is one pool, not a second
copy of the model, and the engine keeps running on the published bytes.

Tensors may be non-contiguous when they are a permutation of a dense layout (a
transposed weight, say): the bytes are stored in memory order and the manifest keeps
the engine's strides, so the view has the same strides as the original.

Not covered: overlapping or gappy layouts (copied contiguous, with a warning).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

import torch

from .. import evidence
from ..client import ensure_daemon
from ..config import AttachConfig
from ..errors import HotweightsError, ManifestError
from ..key import CacheKey
from ..manifest import DTYPE_ITEMSIZE, Manifest, TensorSpec, pack
from ..paths import daemon_paths
from ..pools import backend, tensor_views
from ..protocol import close_fds
from .attach import AttachResult
from .devices import Device

logger = logging.getLogger(__name__)
DEFAULT_CHUNK_BYTES = 1 << 30


def dense_order(t: torch.Tensor) -> list[int] | None:
    """Dims ordered so that ``t.permute(order)`` is contiguous, or None if no such order."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))
    return order if t.permute(order).is_contiguous() else None


def publish_tensors(tensors: dict[str, torch.Tensor], key: CacheKey, config: AttachConfig, *, device: Device,
                    aliases: Mapping[str, str] | None = None,
                    repoint: Callable[[str, torch.Tensor], None] | None = None,
                    chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> AttachResult:
    """Publish ``tensors`` under ``key``; returns the published views as an attach result.

    Consumes ``tensors`` (the dict is emptied), so that each original can be freed as
    soon as its pool is sealed; keep no other references to them.

    ``repoint(name, view)`` is called for every tensor (and alias) once its pool is
    sealed, so the caller can drop its original. A refused publish (entry exists,
    budget) is logged and still returns the views: the engine runs on them privately.
    """
    if not tensors:
        raise ValueError("write-through got no tensors to publish")
    start = time.perf_counter()
    items, strides, sources = [], {}, {}
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPE_ITEMSIZE:
            raise ManifestError(f"tensor {name!r} has dtype {dtype}, which hotweights cannot share; "
                                f"known: {sorted(DTYPE_ITEMSIZE)}")
        if t.is_contiguous():
            items.append((name, dtype, tuple(t.shape)))
        elif (order := dense_order(t)) is not None:
            items.append((name, dtype, tuple(t.shape[d] for d in order)))  # memory order
            strides[name] = (tuple(t.shape), tuple(t.stride()))
            t = t.permute(order)
        else:
            logger.warning("write-through: tensor %s has a non-dense layout %s; stored contiguous", name, t.stride())
            t = t.contiguous()
            items.append((name, dtype, tuple(t.shape)))
        sources[name] = t
    del t  # hold no reference of our own: each original must die with its repoint
    tensors.clear()
    pool_specs, packed = pack(items, pool_bytes=chunk_bytes, device=device.pool_device)
    specs = tuple(TensorSpec(s.name, s.dtype, *strides[s.name], s.pool, s.offset, s.nbytes)
                  if s.name in strides else s for s in packed)
    impl = backend(device.pool_device)
    need = sum(p.nbytes for p in pool_specs)
    fds: list[int] = []
    views: dict[str, torch.Tensor] = {}
    alias_map = dict(aliases or {})
    by_target: dict[str, list[str]] = {}
    for alias, target in alias_map.items():
        by_target.setdefault(target, []).append(alias)
    try:
        for index, pool_spec in enumerate(pool_specs):
            in_pool = [s for s in specs if s.pool == index]
            if pool_spec.nbytes > impl.available_bytes(device.pool_device):
                raise HotweightsError(f"write-through needs {pool_spec.nbytes / 2**30:.2f} GiB more on "
                                      f"{device.pool_device} for the next pool; not publishing")
            pool = impl.create(pool_spec.nbytes, device.pool_device)
            try:
                flat = pool.as_tensor()
                for s in in_pool:
                    src = sources.pop(s.name)
                    flat[s.offset: s.offset + s.nbytes].view(src.dtype).view(src.shape).copy_(src)
                    del src
                if flat.is_cuda:
                    torch.cuda.current_stream(flat.device).synchronize()
                del flat
                fd = pool.export()
            finally:
                pool.close()
            fds.append(fd)
            mapped = impl.import_pool(os.dup(fd), pool_spec)
            one = Manifest(key, (pool_spec,),
                           tuple(TensorSpec(s.name, s.dtype, s.shape, s.stride, 0, s.offset, s.nbytes) for s in in_pool))
            for name, view in tensor_views(one, [mapped]).items():
                views[name] = view
                for alias in by_target.get(name, ()):
                    views[alias] = view
                if repoint is not None:
                    for n in (name, *by_target.get(name, ())):
                        repoint(n, view)
        manifest = Manifest(key, pool_specs, specs, alias_map, time.perf_counter() - start)
        paths = daemon_paths(config.socket_dir)
        with ensure_daemon(paths) as client:
            socket_path = str(client.socket_path)
            try:
                client.publish(manifest, fds)
            except HotweightsError as exc:
                logger.warning("write-through publish refused: %s; the engine keeps its own copy", exc)
                return AttachResult("ok", tensors=views, manifest=manifest, socket_path=socket_path)
    finally:
        close_fds(fds)
    seconds = time.perf_counter() - start
    logger.info(evidence.published(len(specs), manifest.tensor_nbytes, key.model, key.short, key.device, seconds))
    logger.info("write-through peak extra memory: one pool of at most %.2f GiB (entry %.2f GiB in %d pools)",
                max(p.nbytes for p in pool_specs) / 2**30, need / 2**30, len(pool_specs))
    return AttachResult("ok", tensors=views, manifest=manifest, socket_path=socket_path, ms=seconds * 1e3)
