"""The one pool writer: lay tensors out in pools, fill them, seal, publish.

``PoolWriter`` serves both ways of filling the cache:

- **all at once** (``hotweights preload``): room for the whole entry is checked and every
  pool created up front, because a shard's tensors land in any pool.
- **pool by pool** (write-through of an engine's own tensors, ``publish_tensors``):
  each pool is created when first written, checked for room then, and sealed as soon as
  it is full; its read-only mapping goes to ``repoint`` (the engine swaps its tensor for
  the view), so the engine's original is freed before the next pool is written (on a
  GPU given back to the driver at once: torch's allocator would keep it cached, and
  the process would hold both copies to its end). The peak extra memory is one pool,
  not a second copy of the model, and the engine keeps running on the published bytes.

Tensors may be non-contiguous when they are a permutation of a dense layout (a
transposed weight, say): the bytes are stored in memory order and the manifest keeps
the engine's strides, so the view has the same strides as the original.

Lifetime: the writer owns its pools until ``export``, which hands the sealed fds to the
caller (``publish`` sends them and closes them).

Not covered: overlapping or gappy layouts (copied contiguous, with a warning).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .. import evidence
from ..client import Client, connect_for
from ..config import DEFAULT_POOL_BYTES, AttachConfig
from ..errors import HotweightsError, ManifestError, PoolError
from ..evidence import GIB
from ..key import CacheKey
from ..manifest import DTYPE_ITEMSIZE, Manifest, TensorSpec, pack
from ..pools import backend, tensor_views, torch_dtype
from ..pools.devices import Device
from ..wire import close_fds

logger = logging.getLogger(__name__)

Item = tuple[str, str, tuple[int, ...]]  # name, dtype, shape (in memory order)


class PoolWriter:
    """Pools laid out for a list of tensors; ``dest(name)`` is where each one goes."""

    def __init__(self, items: list[Item], *, device: str, pool_bytes: int, all_at_once: bool = True,
                 strides: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None) -> None:
        self.pool_specs, packed = pack(items, pool_bytes=pool_bytes, device=device)
        strides = strides or {}
        self.specs = tuple(TensorSpec(s.name, s.dtype, *strides[s.name], s.pool, s.offset, s.nbytes)
                           if s.name in strides else s for s in packed)
        self.device = device
        self._impl = backend(device)
        self._by_name = {s.name: s for s in packed}  # memory-order shapes: where the bytes go
        n = len(self.pool_specs)
        self.pools: list = [None] * n
        self._flat: list[torch.Tensor | None] = [None] * n
        self._fds: list[int] = []
        if all_at_once:
            self._check_room(sum(p.nbytes for p in self.pool_specs), "the entry")
            try:
                for i in range(n):
                    self._open(i)
            except BaseException:
                self.close()
                raise

    def _check_room(self, nbytes: int, what: str) -> None:
        free = self._impl.available_bytes(self.device)
        if nbytes > free:
            raise PoolError(f"not enough memory on {self.device}: {what} needs {nbytes / GIB:.2f} GiB, "
                            f"{free / GIB:.2f} GiB is available; free memory or release entries")

    def _open(self, index: int) -> torch.Tensor:
        if self._flat[index] is None:
            self.pools[index] = self._impl.create(self.pool_specs[index].nbytes, self.device)
            self._flat[index] = self.pools[index].as_tensor()
        return self._flat[index]

    @property
    def torch_device(self) -> torch.device:
        first = next((f for f in self._flat if f is not None), None)
        return first.device if first is not None else torch.device("cpu")

    def dest(self, name: str) -> torch.Tensor:
        s = self._by_name[name]
        if self._flat[s.pool] is None:
            self._check_room(self.pool_specs[s.pool].nbytes, "the next pool")
        flat = self._open(s.pool)
        return flat[s.offset: s.offset + s.nbytes].view(torch_dtype(s.dtype)).view(s.shape)

    def seal(self, index: int) -> torch.Tensor:
        """End writing pool ``index``; returns its read-only mapping (a flat uint8 tensor)."""
        flat, self._flat[index] = self._flat[index], None
        if flat is not None and flat.is_cuda:
            torch.cuda.current_stream(flat.device).synchronize()
        del flat
        pool, self.pools[index] = self.pools[index], None
        try:
            fd = pool.export()
        finally:
            pool.close()
        self._fds.append(fd)
        return self._impl.import_pool(os.dup(fd), self.pool_specs[index])

    def export(self, key: CacheKey, *, load_s: float, aliases: Mapping[str, str] | None = None
               ) -> tuple[Manifest, list[int]]:
        """Finish writing; the returned fds belong to the caller (send, then close)."""
        manifest = Manifest(key, self.pool_specs, self.specs, dict(aliases or {}), load_s)
        try:
            for i, pool in enumerate(self.pools):
                if pool is not None:
                    self._flat[i] = None
                    self._fds.append(pool.export())
        except BaseException:
            self.close()
            raise
        fds, self._fds = self._fds, []
        self.close()
        return manifest, fds

    def close(self) -> None:
        self._flat = [None] * len(self.pool_specs)
        for pool in self.pools:
            if pool is not None:
                pool.close()
        self.pools = [None] * len(self.pool_specs)
        close_fds(self._fds)
        self._fds = []


def publish(client: Client, writer: PoolWriter, key: CacheKey, *, load_s: float,
            aliases: Mapping[str, str] | None = None) -> Manifest:
    """Export the writer's pools and publish them under ``key``."""
    manifest, fds = writer.export(key, load_s=load_s, aliases=aliases)
    try:
        client.publish(manifest, fds)
    finally:
        close_fds(fds)
    return manifest


@dataclass(frozen=True, slots=True)
class Published:
    views: dict[str, torch.Tensor]  # the tensors over the sealed pools (aliases included)
    manifest: Manifest
    accepted: bool  # False: the daemon refused (entry exists, budget); the engine keeps the views
    seconds: float


def dense_order(t: torch.Tensor) -> list[int] | None:
    """Dims ordered so that ``t.permute(order)`` is contiguous, or None if no such order."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))
    return order if t.permute(order).is_contiguous() else None


def publish_tensors(tensors: dict[str, torch.Tensor], key: CacheKey, config: AttachConfig, *, device: Device,  # noqa: C901, PLR0912
                    aliases: Mapping[str, str] | None = None,
                    repoint: Callable[[str, torch.Tensor], None] | None = None,
                    pool_bytes: int = DEFAULT_POOL_BYTES) -> Published:
    """Publish an engine's ``tensors`` under ``key``, pool by pool (see the module docstring).

    Consumes ``tensors`` (the dict is emptied), so that each original can be freed as
    soon as its pool is sealed; keep no other references to them. ``repoint(name, view)``
    is called for every tensor (and alias) once its pool is sealed.
    """
    if not tensors:
        raise ValueError("write-through got no tensors to publish")
    start = time.perf_counter()
    items: list[Item] = []
    strides, sources = {}, {}
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPE_ITEMSIZE:
            raise ManifestError(f"tensor {name!r} has dtype {dtype}, which hotweights cannot share; "
                                f"known: {sorted(DTYPE_ITEMSIZE)}")
        if not t.is_contiguous():
            if (order := dense_order(t)) is not None:
                strides[name] = (tuple(t.shape), tuple(t.stride()))
                t = t.permute(order)  # memory order
            else:
                logger.warning("write-through: tensor %s has a non-dense layout %s; stored contiguous",
                               name, t.stride())
                t = t.contiguous()
        items.append((name, dtype, tuple(t.shape)))
        sources[name] = t
    del t  # hold no reference of our own: each original must die with its repoint
    tensors.clear()
    writer = PoolWriter(items, device=device.pool_device, pool_bytes=pool_bytes, all_at_once=False, strides=strides)
    by_target: dict[str, list[str]] = {}
    for alias, target in (aliases or {}).items():
        by_target.setdefault(target, []).append(alias)
    views: dict[str, torch.Tensor] = {}
    try:
        for index, pool_spec in enumerate(writer.pool_specs):
            in_pool = [s for s in writer.specs if s.pool == index]
            for s in in_pool:
                writer.dest(s.name).copy_(sources.pop(s.name))
            one = Manifest(key, (pool_spec,), tuple(TensorSpec(s.name, s.dtype, s.shape, s.stride, 0, s.offset,
                                                               s.nbytes) for s in in_pool))
            for name, view in tensor_views(one, [writer.seal(index)]).items():
                for n in (name, *by_target.get(name, ())):
                    views[n] = view
                    if repoint is not None:
                        repoint(n, view)
            if device.kind == "cuda":  # the originals this pool replaced, back to the driver: torch's allocator
                torch.cuda.empty_cache()  # would keep them cached beside the pools (the peak then two copies)
        with connect_for(config, start=True) as client:
            manifest = publish(client, writer, key, load_s=time.perf_counter() - start, aliases=aliases)
    except HotweightsError as exc:
        if sources:  # not every tensor made it into a pool: nothing to publish
            raise
        logger.warning("%s: %s; the engine keeps its own copy", evidence.WT_PUBLISH_REFUSED, exc)
        return Published(views, Manifest(key, writer.pool_specs, writer.specs, dict(aliases or {})), False,
                         time.perf_counter() - start)
    finally:
        writer.close()
    seconds = time.perf_counter() - start
    logger.info(evidence.published(len(manifest.tensors), manifest.tensor_nbytes, key.model, key.short, key.device,
                                   seconds))
    logger.info("write-through peak extra memory: one pool of at most %.2f GiB (entry %.2f GiB in %d pools)%s",
                max(p.nbytes for p in writer.pool_specs) / GIB, manifest.nbytes / GIB, len(writer.pool_specs),
                "" if device.kind != "cuda" else
                f"; torch holds {torch.cuda.memory_reserved(device.index) / GIB:.2f} GiB after it")
    return Published(views, manifest, True, seconds)
