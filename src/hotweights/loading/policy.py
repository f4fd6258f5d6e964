"""The fallback policy, once for every engine: cache first; else disk (logged) or fail.

An engine hands ``attach_first`` an ordered list of ``Candidate`` keys and a ``use``
function that turns an attached entry into what the engine needs; ``diagnosis.diagnose``
walks them. The first candidate that attaches and that ``use`` accepts wins. When none does:

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
from ..client import Outcome
from ..config import AttachConfig
from ..errors import ManifestError, WeightCacheUnusable
from ..key import CacheKey
from ..pools.devices import resolve_device
from .attach import AttachResult, attach_tensors
from .checkpoint import Checkpoint, checkpoint_key, open_checkpoint
from .diagnosis import Candidate, diagnose
from .preload import publish_from_disk, read_disk

logger = logging.getLogger(__name__)
T = TypeVar("T")


def attach_first(candidates: Sequence[Candidate], config: AttachConfig,
                 use: Callable[[Candidate, AttachResult], T], *, skipped: Sequence[str] = ()) -> tuple[T | None, str]:
    """``(use(candidate, attached), "")`` for the first candidate that attaches and fits,
    else ``(None, reason)`` after the fallback line; raises in strict mode.

    ``skipped``: why candidates the engine cannot use were left out (they lead the reason).
    """
    used: list[T] = []

    def ask(cand: Candidate, first: bool) -> AttachResult:
        # a strict config waits for a starting daemon once, not once per candidate
        result = attach_tensors(cand.key, config if first else dataclasses.replace(config, state_timeout_s=0.0),
                                evidence_mode=cand.evidence_mode)
        if not result.ok:
            return result
        try:
            used.append(use(cand, result))
        except (ManifestError, RuntimeError, ValueError) as exc:
            entry = f"{cand.label.replace(' ', '-')} entry" if cand.label else "cached entry"
            return AttachResult(Outcome.UNUSABLE, f"{entry} does not fit this model: {exc}")
        return result

    found = diagnose(candidates, ask, skipped=skipped)
    if found.served is not None:
        if found.reasons:
            logger.info("no usable %s entry (%s); using the %s entry", candidates[0].label, found.reasons[0],
                        found.served.label)
        return used[-1], ""
    if not config.fallback:
        raise WeightCacheUnusable(found.strict_message(), reason=found.reason)
    logger.warning(evidence.falling_back(found.reason))
    return None, found.reason


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
    key = checkpoint_key(ckpt, dtype=dtype, device=dev, rehash=config.rehash and use_cache)

    def done(tensors: dict[str, torch.Tensor], source: Source, reason: str = "") -> LoadedWeights:
        return LoadedWeights(tensors, source, key, time.perf_counter() - start, reason)

    if not use_cache:
        return done(read_disk(ckpt, dtype, dev), Source.DISK, "load format auto")
    tensors, reason = attach_first([Candidate(key)], config, lambda _, attached: attached.tensors)
    if tensors is not None:
        return done(tensors, Source.CACHE)
    if config.publish and (published := publish_from_disk(ckpt, dtype, dev, config)).ok:
        return done(published.tensors, Source.DISK_PUBLISH, reason)
    return done(read_disk(ckpt, dtype, dev), Source.DISK, reason)
