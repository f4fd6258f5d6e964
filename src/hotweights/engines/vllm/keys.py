"""The cache keys of one vLLM worker's start, and the entries it may attach, in order.

Imported by the loader and by the budget (which runs inside vLLM's memory request, before any loader
is asked to load): one place builds them, from vLLM's resolved config and this worker's TP/PP rank.
Built once per worker process and start: the memo is keyed by what makes the keys (model, dtype,
layout string, device, ranks, rehash), not by the identity of a config object. Building them reads
checkpoint headers and the digest cache, no weight bytes (``rehash`` hashes the files again).

- engine layout ``vllm/<version>[/quant=Q][/kv=D]``, with the tp/pp ranks: what vLLM holds after its
  post-processing (``loader``);
- checkpoint layout: tensors as in the files after the dtype cast, streamed into vLLM's loaders.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import vllm

from ...config import AttachConfig
from ...key import CacheKey
from ...loading.checkpoint import Checkpoint, checkpoint_key, open_checkpoint
from ...loading.diagnosis import Candidate
from ...loading.digest import DigestCache
from ...pools.devices import Device, resolve_device
from . import capabilities
from .options import LAYOUT_PREFIX


@dataclasses.dataclass(frozen=True, slots=True)
class Keys:
    ckpt: Checkpoint
    device: Device
    dtype: str
    engine: CacheKey
    checkpoint: CacheKey


_MEMO: dict[tuple[Any, ...], Keys] = {}  # the budget and the loader of one worker ask alike


def keys_for(vllm_config: Any, config: AttachConfig) -> Keys:
    """This worker's keys for ``vllm_config`` (vLLM's resolved config; its TP/PP groups are set up)."""
    from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    model_config = vllm_config.model_config
    device = torch.device(vllm_config.device_config.device)
    dev = resolve_device(str(device) if device.type == "cuda" else "cpu")  # "cuda": the current device
    dtype = str(model_config.dtype).removeprefix("torch.")
    layout = f"{LAYOUT_PREFIX}{getattr(vllm, '__version__', 'unknown')}"
    if quant := getattr(model_config, "quantization", None):
        layout += f"/quant={quant}"
    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    if cache_dtype and cache_dtype != "auto":
        layout += f"/kv={cache_dtype}"
    pp = get_pp_group()
    ranks = dict(tp_size=get_tensor_model_parallel_world_size(), tp_rank=get_tensor_model_parallel_rank(),
                 pp_size=pp.world_size, pp_rank=pp.rank_in_group)
    memo = (model_config.model, dtype, layout, dev, tuple(ranks.values()), config.rehash)
    if memo in _MEMO:
        return _MEMO[memo]
    ckpt = open_checkpoint(model_config.model, validate=False)  # headers only: the key needs no more
    digests = DigestCache()  # digests.json read once for both keys
    fresh = ({s.name: digests.digest(s.path, s.stat, rehash=True) for s in ckpt.shards}  # once, for both keys
             if config.rehash else None)
    engine = checkpoint_key(ckpt, dtype=dtype, device=dev, cache=digests, digests=fresh, layout=layout, **ranks)
    checkpoint = checkpoint_key(ckpt, dtype=dtype, device=dev, cache=digests, digests=fresh)
    found = _MEMO[memo] = Keys(ckpt, dev, dtype, engine, checkpoint)
    return found


def candidates(keys: Keys, layout: str, caps: capabilities.Capabilities,
               quantization: str | None) -> tuple[list[Candidate], list[str]]:
    """The entries this worker may attach, in order, and why others are left out (``layout``: the extra
    config's ``auto | engine | checkpoint``)."""
    found, skipped = [], []
    refusal = capabilities.engine_layout_refusal(caps, quantization)
    if layout in ("auto", "engine") and refusal:
        skipped.append(f"engine layout: {refusal}" if layout == "auto" else refusal)
    elif layout in ("auto", "engine"):
        found.append(Candidate(keys.engine, "engine layout"))
    if layout in ("auto", "checkpoint"):
        found.append(Candidate(keys.checkpoint, "checkpoint layout", evidence_mode="stream"))
    return found, skipped


def maps_zero_copy(config: AttachConfig, layout: str) -> bool:
    """Whether a start with this extra config maps an engine-layout entry as its weights (so its bytes are
    the engine's, outside vLLM's allocator)."""
    return config.mode == "zero_copy" and layout != "checkpoint"
