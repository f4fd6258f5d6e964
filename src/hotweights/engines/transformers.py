"""transformers adapter: ``load_model`` builds a causal LM whose weights come from the cache.

The model is built with parameters on the meta device (no memory, no random init),
then ``attach_module`` installs the cached tensors as parameters: zero-copy views of
the daemon's pools, or engine-owned clones in copy mode. With ``load_format="auto"``
it is an ordinary disk load through the same path, for baselines. ``generate`` is
``hotweights generate``: load, then complete one prompt greedily.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from ..config import AttachConfig
from ..loading.checkpoint import open_checkpoint
from ..loading.policy import LoadedWeights, Source, load_tensors
from .modules import attach_module, meta_parameters

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadReport:
    source: Source
    build_s: float
    weights_s: float
    reason: str
    key_short: str


def load_model(model_dir: str | os.PathLike[str], *, dtype: str = "auto", device: str = "cpu",
               config: AttachConfig | dict | None = None, load_format: str = "hotweights"):
    """Return ``(model, LoadReport)``; raises WeightCacheUnusable in strict mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if load_format not in ("hotweights", "auto"):
        raise ValueError(f"load_format must be 'hotweights' or 'auto', got {load_format!r}")
    if not isinstance(config, AttachConfig):
        config = AttachConfig.from_dict(config)
    t0 = time.perf_counter()
    ckpt = open_checkpoint(model_dir, validate=False)  # the key needs the headers only
    dtype = ckpt.resolve_dtype(dtype)
    hf_config = AutoConfig.from_pretrained(model_dir)
    with meta_parameters():
        model = AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype))
    t1 = time.perf_counter()
    weights: LoadedWeights = load_tensors(ckpt, dtype=dtype, device=device, config=config,
                                          use_cache=load_format == "hotweights")
    attach_module(model, weights.tensors)
    target = next(iter(weights.tensors.values())).device if weights.tensors else torch.device("cpu")
    model.to(target)  # moves only the real buffers; parameters are already there
    model.eval()
    t2 = time.perf_counter()
    return model, LoadReport(weights.source, t1 - t0, t2 - t1, weights.reason, weights.key.short)


@dataclass(frozen=True, slots=True)
class Generated:
    text: str
    token_ids: list[int]
    report: LoadReport
    total_s: float


def generate(model_dir: str | os.PathLike[str], prompt: str, *, max_tokens: int = 16, dtype: str = "auto",
             device: str = "cpu", config: AttachConfig | dict | None = None,
             load_format: str = "hotweights") -> Generated:
    """Load ``model_dir`` (cache or disk) and complete ``prompt`` greedily."""
    from transformers import AutoTokenizer

    start = time.perf_counter()
    model, report = load_model(model_dir, dtype=dtype, device=device, config=config, load_format=load_format)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model.device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new = out[0, ids.shape[1]:]
    return Generated(tokenizer.decode(new, skip_special_tokens=True), new.tolist(), report,
                     time.perf_counter() - start)
