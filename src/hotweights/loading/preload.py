"""Preload: read a checkpoint into pools, publish them to the daemon, exit.

One disk -> pools -> digests -> key path (``fill_from_disk``) serves ``hotweights preload``
and the write-through of an engine that loaded from disk (``publish_from_disk``);
``read_disk`` is the plain disk load, for engines that do not publish.

The loader is the only process that reads weight bytes. Per shard it walks the file
through an ``mmap`` in offset order, hashing every byte (xxh3-128, for the cache key)
and copying each tensor into its pool slot with the dtype cast, so each page is read
from disk once. The pools are written by ``publish.PoolWriter`` (all at once).

Not covered: tensor-parallel sharding of checkpoint-layout entries (an engine's TP
ranks slice the checkpoint tensors themselves), quantized re-packing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import evidence
from ..client import Outcome, connect_for
from ..config import DEFAULT_POOL_BYTES, AttachConfig
from ..errors import CheckpointError, DaemonUnavailable, ProtocolError, TrustError
from ..key import CacheKey
from ..rows import EntryRow
from ..pools.devices import Device, resolve_device
from .attach import AttachResult, attach_tensors
from .checkpoint import Checkpoint, checkpoint_key, open_checkpoint, target_dtype
from .digest import DigestCache
from .headroom import WontFit, check_budget, check_fits
from .publish import PoolWriter, publish
from .reader import Staging, plan_segments

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreloadResult:
    key: CacheKey
    num_tensors: int
    nbytes: int
    seconds: float
    already_cached: bool
    socket_path: Path

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def preload(model_dir: str | os.PathLike[str], *, dtype: str = "auto", device: str = "cpu", tp_size: int = 1,
            pool_bytes: int = DEFAULT_POOL_BYTES, socket_dir: str | None = None,
            progress: Callable[[int, int], None] | None = None) -> PreloadResult:
    """Load ``model_dir`` into pools on ``device`` and publish; no-op if already cached.

    ``progress(done_bytes, total_bytes)`` is called as shards are read.
    """
    if tp_size != 1:
        raise CheckpointError(
            f"--tensor-parallel-size {tp_size}: checkpoint-layout entries hold whole tensors and every TP rank "
            f"slices them itself; preload with --tensor-parallel-size 1 (engine-layout TP entries come from "
            f"the vLLM plugin)")
    if pool_bytes <= 0:
        raise ValueError(f"pool_bytes must be > 0, got {pool_bytes}")
    ckpt = open_checkpoint(model_dir)
    dtype = ckpt.resolve_dtype(dtype)
    try:
        dev = resolve_device(device)
    except RuntimeError as exc:  # a GPU too full for a CUDA context: one line, not a CUDA traceback
        if "out of memory" not in str(exc).lower():
            raise
        raise WontFit(f"cannot use {device}: no memory left there for a CUDA context ({str(exc)[:120]}); free "
                      f"GPU memory first") from None
    cache = DigestCache()
    config = AttachConfig(socket_dir=socket_dir)
    with connect_for(config, start=True) as client:  # the cached check, on a connection closed before the read
        known = {s.name: d for s in ckpt.shards if (d := cache.get(s.stat))}
        if len(known) == len(ckpt.shards):
            key = checkpoint_key(ckpt, dtype=dtype, device=dev, digests=known)
            if entry := client.entry(key):
                logger.info("already cached: key=%s model=%s", key.short, key.model)
                return _cached(key, entry, 0.0, client.socket_path)
        status = client.status()
        check_budget(ckpt, dtype, status.max_bytes, sum(r.nbytes + r.host_nbytes for r in status.rows()))
    check_fits(ckpt, dtype, dev.kind, dev.index)  # before a byte is read: one line, not an OOM kill
    start = time.perf_counter()
    writer, key = fill_from_disk(ckpt, dtype, dev, pool_bytes=pool_bytes, progress=progress, cache=cache)
    seconds = time.perf_counter() - start
    # a new connection to publish: the daemon closes one idle for longer than its idle timeout (a minute),
    # and reading a large checkpoint takes longer than that
    with connect_for(config, start=True) as client:
        try:
            manifest = publish(client, writer, key, load_s=seconds)
        except ProtocolError as exc:
            # the same bytes under the same key are already cached (a chmod or a byte-identical
            # copy only missed the digest cache): that is success, not a conflict
            entry = client.entry(key) if exc.code == "exists" else None
            if entry is None:
                raise
            logger.info("already cached: key=%s model=%s (read again: the digest cache did not know the files)",
                        key.short, key.model)
            return _cached(key, entry, seconds, client.socket_path)
        return PreloadResult(key, len(manifest.tensors), manifest.tensor_nbytes, seconds, False, client.socket_path)


def _cached(key: CacheKey, entry: EntryRow, seconds: float, socket_path: Path) -> PreloadResult:
    """The result of a preload that found ``key`` cached (``entry``: its status row)."""
    return PreloadResult(key, entry.num_tensors, entry.tensor_nbytes, seconds, True, socket_path)


def fill_from_disk(ckpt: Checkpoint, dtype: str, dev: Device, *, pool_bytes: int = DEFAULT_POOL_BYTES,
                   progress: Callable[[int, int], None] | None = None,
                   cache: DigestCache | None = None) -> tuple[PoolWriter, CacheKey]:
    """Read ``ckpt`` into pools on ``dev`` and remember its digests: the pools and their key."""
    writer, digests = load_checkpoint(ckpt, dtype=dtype, device=dev.pool_device, pool_bytes=pool_bytes,
                                      progress=progress)
    cache = cache or DigestCache()
    for shard in ckpt.shards:
        cache.put(shard.stat, digests[shard.name])
    return writer, checkpoint_key(ckpt, dtype=dtype, device=dev, digests=digests)


def publish_from_disk(ckpt: Checkpoint, dtype: str, dev: Device, config: AttachConfig, *,
                      evidence_mode: str | None = None) -> AttachResult:
    """Write-through of a checkpoint: disk -> pools -> publish -> attach our own published pools.
    When that does not attach, says why in one line; the caller then loads from disk."""
    start = time.perf_counter()
    writer, key = fill_from_disk(ckpt, dtype, dev)
    try:
        with connect_for(config, start=True) as client:
            manifest = publish(client, writer, key, load_s=time.perf_counter() - start)
    except (DaemonUnavailable, TrustError) as exc:
        writer.close()
        result = AttachResult(Outcome.ABSENT, f"no daemon to publish to: {exc}")
    else:
        logger.info(evidence.published(len(manifest.tensors), manifest.tensor_nbytes, key.model, key.short,
                                       key.device, time.perf_counter() - start))
        result = attach_tensors(key, config, evidence_mode=evidence_mode)
    if not result.ok:
        logger.warning("write-through publish not attachable: reason=%s; loading from disk", result.reason)
    return result


def read_disk(ckpt: Checkpoint, dtype: str, dev: Device) -> dict[str, torch.Tensor]:
    """Every tensor of ``ckpt`` on ``dev``, cast to ``dtype``: a plain disk load."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    quantized = ckpt.quantization[0] != "none"
    target = str(dev.torch_device)
    out: dict[str, torch.Tensor] = {}
    for shard in ckpt.shards:
        try:
            tensors = load_file(shard.path, device=target)
        except SafetensorError as exc:  # one line, as the preload says it, not safetensors' traceback
            raise CheckpointError(f"{shard.path} cannot be read ({exc}): the file is damaged or truncated; "
                                  f"download it again") from None
        for name, t in tensors.items():
            want = getattr(torch, target_dtype(str(t.dtype).removeprefix("torch."), dtype, quantized))
            out[name] = t if t.dtype == want else t.to(want)
    return out


def load_checkpoint(ckpt: Checkpoint, *, dtype: str, device: str, pool_bytes: int,
                    progress: Callable[[int, int], None] | None = None) -> tuple[PoolWriter, dict[str, str]]:
    """Fill pools with every tensor (cast to ``dtype``); returns the writer and shard digests."""
    ckpt.validate()  # a checkpoint opened for its key only is checked before its bytes are read
    quantized = ckpt.quantization[0] != "none"
    items = [(t.name, target_dtype(t.dtype, dtype, quantized), t.shape) for s in ckpt.shards for t in s.tensors]
    writer = PoolWriter(items, device=device, pool_bytes=pool_bytes)
    digests: dict[str, str] = {}
    done, total = 0, ckpt.nbytes
    staging = Staging(writer.torch_device)
    try:
        for shard in ckpt.shards:
            if os.stat(shard.path).st_mtime_ns != shard.stat.st_mtime_ns:
                raise CheckpointError(f"{shard.path} changed since it was opened; run preload again")
            size = shard.stat.st_size
            segments = plan_segments(shard.tensors, writer.dest, size)
            digests[shard.name] = staging.fill(shard.path, size, segments,
                                               lambda n, base=done: progress(base + n, total) if progress else None)
            done += size
        staging.close()
    except BaseException:
        staging.close()
        writer.close()
        raise
    return writer, digests
