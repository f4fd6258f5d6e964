"""The fallback policy, once for every engine: cache first; else disk (logged) or fail.

An engine hands ``attach_first`` an ordered list of ``Candidate`` keys (the vLLM plugin:
engine layout, then checkpoint layout; transformers: one checkpoint key) and a ``use``
function that turns an attached entry into what the engine needs. The first candidate
that attaches and that ``use`` accepts wins. When none does:

- ``fallback=True``: log ``Weight cache unusable (<reason>); falling back to disk
  loading`` and return the reason; the engine then reads the checkpoint (with
  ``publish=True`` it publishes what it read: write-through, so the next start is warm).
- ``fallback=False``: raise ``WeightCacheUnusable`` whose message starts
  ``Weight cache unusable (<reason>) and fallback is disabled``.

Never a silent fallback. ``load_tensors`` is the whole policy for checkpoint tensors.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import torch

from .. import evidence
from ..client import Outcome, connect_for
from ..config import AttachConfig
from ..errors import DaemonUnavailable, ManifestError, TrustError, WeightCacheUnusable
from ..key import CacheKey
from ..pools.devices import Device, resolve_device
from .attach import AttachResult, attach_tensors
from .checkpoint import Checkpoint, checkpoint_key, open_checkpoint, target_dtype
from .digest import DigestCache
from .preload import load_checkpoint
from .publish import DEFAULT_POOL_BYTES, publish

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Candidate:
    key: CacheKey
    label: str = ""  # "engine layout": prefixes its reason when several candidates are tried
    evidence_mode: str | None = None  # the mode named in the Mapped line, when not the config's


def attach_first(candidates: Sequence[Candidate], config: AttachConfig,
                 use: Callable[[Candidate, AttachResult], T], *, skipped: Sequence[str] = ()) -> tuple[T | None, str]:
    """``(use(candidate, attached), "")`` for the first candidate that attaches and fits,
    else ``(None, reason)`` after the fallback line; raises in strict mode.

    ``skipped``: why candidates the engine cannot use were left out (they lead the reason).
    """
    reasons: list[str] = list(skipped)
    advice = ""
    for cand in candidates:
        # a strict config waits for a starting daemon once, not once per candidate
        result = attach_tensors(cand.key, dataclasses.replace(config, state_timeout_s=0.0) if reasons else config,
                                evidence_mode=cand.evidence_mode)
        if result.ok:
            try:
                value = use(cand, result)
            except (ManifestError, RuntimeError, ValueError) as exc:
                entry = f"{cand.label.replace(' ', '-')} entry" if cand.label else "cached entry"
                result = AttachResult(Outcome.UNUSABLE, f"{entry} does not fit this model: {exc}")
            else:
                if reasons:
                    logger.info("no usable %s entry (%s); using the %s entry", candidates[0].label, reasons[0],
                                cand.label)
                return value, ""
        advice = advice or evidence.advice_for(result.outcome, result.diffs)
        reasons.append(candidate_reason(cand, result.outcome, result.reason, len(candidates)))
        if result.outcome is Outcome.ABSENT:
            break  # no daemon: no other key can do better
    reason = "; ".join(reasons)
    if not config.fallback:
        raise WeightCacheUnusable(strict_message(reasons, advice), reason=reason)
    logger.warning(evidence.falling_back(reason))
    return None, reason


def candidate_reason(cand: Candidate, outcome: Outcome, reason: str, tried: int) -> str:
    """Why one candidate did not serve, labelled when several were tried (no daemon is none's fault)."""
    return f"{cand.label}: {reason}" if tried > 1 and outcome is not Outcome.ABSENT else reason


def strict_message(reasons: Sequence[str], advice: str) -> str:
    """The strict failure for these candidates' reasons (``Weight cache unusable (...) and fallback is disabled``)."""
    return evidence.strict_failure("; ".join(reasons), advice or evidence.START_AND_PRELOAD)


class Source(StrEnum):
    CACHE = "cache"
    DISK = "disk"
    DISK_PUBLISH = "disk+publish"


@dataclass(frozen=True, slots=True)
class LoadedWeights:
    tensors: dict[str, torch.Tensor]
    source: Source
    key: CacheKey
    seconds: float
    reason: str = ""


def load_tensors(model: str | os.PathLike[str] | Checkpoint, *, dtype: str = "auto", device: str = "cpu",
                 config: AttachConfig | None = None, use_cache: bool = True) -> LoadedWeights:
    """Weights of ``model`` (a directory or an opened checkpoint) on ``device``, by the policy above."""
    config = config or AttachConfig()
    start = time.perf_counter()
    ckpt = model if isinstance(model, Checkpoint) else open_checkpoint(model, validate=False)
    dtype = ckpt.resolve_dtype(dtype)
    dev = resolve_device(device)
    key = checkpoint_key(ckpt, dtype=dtype, device_kind=dev.kind, device_id=dev.uuid,
                         rehash=config.rehash and use_cache)

    def done(tensors: dict[str, torch.Tensor], source: Source, reason: str = "") -> LoadedWeights:
        return LoadedWeights(tensors, source, key, time.perf_counter() - start, reason)

    if not use_cache:
        return done(read_disk(ckpt, dtype, dev), Source.DISK, "load format auto")
    tensors, reason = attach_first([Candidate(key)], config, lambda _, attached: attached.tensors)
    if tensors is not None:
        return done(tensors, Source.CACHE)
    if config.publish:
        published = publish_from_disk(ckpt, dtype, dev, config)
        if published.ok:
            return done(published.tensors, Source.DISK_PUBLISH, reason)
        logger.warning("write-through publish not attachable: reason=%s; using a plain disk load", published.reason)
    return done(read_disk(ckpt, dtype, dev), Source.DISK, reason)


def read_disk(ckpt: Checkpoint, dtype: str, dev: Device) -> dict[str, torch.Tensor]:
    """Every tensor of ``ckpt`` on ``dev``, cast to ``dtype``: a plain disk load."""
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
    """Write-through of a checkpoint: disk -> pools -> publish -> attach our own published pools."""
    start = time.perf_counter()
    writer, digests = load_checkpoint(ckpt, dtype=dtype, device=dev.pool_device, pool_bytes=DEFAULT_POOL_BYTES)
    cache = DigestCache()
    for shard in ckpt.shards:
        cache.put(shard.stat, digests[shard.name])
    key = checkpoint_key(ckpt, dtype=dtype, device_kind=dev.kind, device_id=dev.uuid, digests=digests)
    try:
        with connect_for(config, start=True) as client:
            manifest = publish(client, writer, key, load_s=time.perf_counter() - start)
    except (DaemonUnavailable, TrustError) as exc:
        writer.close()
        return AttachResult(Outcome.ABSENT, f"no daemon to publish to: {exc}")
    logger.info(evidence.published(len(manifest.tensors), manifest.tensor_nbytes, key.model, key.short,
                                   key.device, time.perf_counter() - start))
    return attach_tensors(key, config, evidence_mode=evidence_mode)
