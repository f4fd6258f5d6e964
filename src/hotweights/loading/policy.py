"""The fallback policy: cache first; on miss/mismatch/absence, disk (logged) or fail.

- ``fallback=True``: log ``Weight cache unusable (<reason>); falling back to disk
  loading`` and read the checkpoint; with ``publish=True`` the disk load goes into
  pools that are published, and the engine then attaches to them (write-through), so
  the next start is warm.
- ``fallback=False``: raise ``WeightCacheUnusable`` whose message starts
  ``Weight cache unusable (<reason>) and fallback is disabled``.

Never a silent fallback.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import torch

from .. import evidence
from ..client import ensure_daemon
from ..config import AttachConfig
from ..errors import WeightCacheUnusable
from ..key import CacheKey
from ..paths import daemon_paths
from .attach import AttachResult, attach_tensors
from .checkpoint import Checkpoint, checkpoint_key, open_checkpoint, target_dtype
from .devices import Device, resolve_device
from .digest import DigestCache
from .preload import DEFAULT_POOL_BYTES, load_checkpoint, publish

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedWeights:
    tensors: dict[str, torch.Tensor]
    source: str  # "cache" | "disk" | "disk+publish"
    key: CacheKey
    seconds: float
    reason: str = ""
    attach: AttachResult | None = field(default=None, repr=False)


def load_tensors(model: str | os.PathLike[str] | Checkpoint, *, dtype: str = "auto", device: str = "cpu",
                 config: AttachConfig | None = None, use_cache: bool = True) -> LoadedWeights:
    """Weights of ``model`` (a directory or an opened checkpoint) on ``device``, by the policy above."""
    config = config or AttachConfig()
    start = time.perf_counter()
    ckpt = model if isinstance(model, Checkpoint) else open_checkpoint(model, validate=False)
    dtype = ckpt.resolve_dtype(dtype)
    dev = resolve_device(device)
    key = checkpoint_key(ckpt, dtype=dtype, device_kind=dev.kind, device_id=dev.uuid)
    if not use_cache:
        tensors = _read_disk(ckpt, dtype, dev)
        return LoadedWeights(tensors, "disk", key, time.perf_counter() - start, "load format auto")
    result = attach_tensors(key, config)
    if result.ok:
        return LoadedWeights(result.tensors, "cache", key, time.perf_counter() - start, attach=result)
    if not config.fallback:
        raise WeightCacheUnusable(evidence.strict_failure(result.reason), reason=result.reason)
    logger.warning(evidence.falling_back(result.reason))
    if config.publish:
        published = publish_from_disk(ckpt, dtype, dev, config)
        if published.ok:
            return LoadedWeights(published.tensors, "disk+publish", key, time.perf_counter() - start,
                                 result.reason, attach=published)
        logger.warning("write-through publish not attachable: reason=%s; using a plain disk load", published.reason)
    tensors = _read_disk(ckpt, dtype, dev)
    return LoadedWeights(tensors, "disk", key, time.perf_counter() - start, result.reason)


def _read_disk(ckpt: Checkpoint, dtype: str, dev: Device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    quantized = ckpt.quantization[0] != "none"
    target = str(dev.torch_device)
    out: dict[str, torch.Tensor] = {}
    for shard in ckpt.shards:
        for name, t in load_file(shard.path, device=target).items():
            want = getattr(torch, target_dtype(str(t.dtype).removeprefix("torch."), dtype, quantized))
            out[name] = t if t.dtype == want else t.to(want)
    return out


def publish_from_disk(ckpt: Checkpoint, dtype: str, dev: Device, config: AttachConfig, *,
                      evidence_mode: str | None = None) -> AttachResult:
    """Write-through: disk -> pools -> publish -> attach our own published pools."""
    start = time.perf_counter()
    writer, digests = load_checkpoint(ckpt, dtype=dtype, device=dev.pool_device, pool_bytes=DEFAULT_POOL_BYTES)
    cache = DigestCache()
    for shard in ckpt.shards:
        cache.put(shard.stat, digests[shard.name])
    key = checkpoint_key(ckpt, dtype=dtype, device_kind=dev.kind, device_id=dev.uuid, digests=digests)
    paths = daemon_paths(config.socket_dir)
    with ensure_daemon(paths) as client:
        manifest = publish(client, writer, key, load_s=time.perf_counter() - start)
    logger.info(evidence.published(len(manifest.tensors), manifest.tensor_nbytes, key.model, key.short,
                                   key.device, time.perf_counter() - start))
    return attach_tensors(key, config, evidence_mode=evidence_mode)


def entry_nbytes(key: CacheKey, config: AttachConfig) -> int:
    """Bytes the daemon holds for ``key`` (what a zero_copy attach will map), 0 if none.

    With fallback false the daemon may still be starting: wait for it like an attach would.
    """
    from ..client import wait_for_daemon
    from ..errors import DaemonUnavailable

    try:
        client = wait_for_daemon(daemon_paths(config.socket_dir), socket_path=config.socket_path,
                                 connect_timeout_s=config.connect_timeout_s,
                                 state_timeout_s=0.0 if config.fallback else config.state_timeout_s)
    except DaemonUnavailable:
        return 0
    with client:
        entries = client.status().entries
    return sum(int(e["nbytes"]) for e in entries if e.get("key") == key.short and e.get("state") == "ready")
