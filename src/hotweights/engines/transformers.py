"""transformers adapter: ``load_model`` builds a causal LM whose weights come from the cache.

The model is built with parameters on the meta device (no memory, no random init),
then ``attach_module`` installs the cached tensors as parameters: zero-copy views of
the daemon's pools, or engine-owned clones in copy mode. With ``load_format="auto"``
it is an ordinary disk load through the same path, for baselines. ``impl="auto"`` (the
server) builds ``engines.native.Decoder`` instead where it covers the architecture, and
imports nothing of transformers then. ``generate`` is ``hotweights generate``: load,
then complete one prompt greedily.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

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
    engine: str = "transformers"  # or "native"


def load_model(model_dir: str | os.PathLike[str], *, dtype: str = "auto", device: str = "cpu",
               config: AttachConfig | dict | None = None, load_format: str = "hotweights", impl: str = "transformers"):
    """Return ``(model, LoadReport)``; raises WeightCacheUnusable in strict mode.

    ``impl``: "transformers"; "native" (the plain-torch decoder, ValueError where it does
    not cover the model); "auto" (native where it covers the model, else transformers, logged).
    """
    if impl not in ("auto", "native", "transformers"):
        raise ValueError(f"impl must be 'auto', 'native' or 'transformers', got {impl!r}")
    if load_format not in ("hotweights", "auto"):
        raise ValueError(f"load_format must be 'hotweights' or 'auto', got {load_format!r}")
    if not isinstance(config, AttachConfig):
        config = AttachConfig.from_dict(config)
    t0 = time.perf_counter()
    ckpt = open_checkpoint(model_dir, validate=False)  # the key needs the headers only
    dtype = ckpt.resolve_dtype(dtype)
    # the weights before the model: a strict start the cache cannot serve fails before it pays for
    # building the model (and, for transformers, importing its modeling code)
    weights: LoadedWeights = load_tensors(ckpt, dtype=dtype, device=device, config=config,
                                          use_cache=load_format == "hotweights")
    t1 = time.perf_counter()
    model, engine = build_on_meta(model_dir, getattr(torch, dtype), impl=impl)
    t2 = time.perf_counter()
    attach_module(model, weights.tensors)
    target = next(iter(weights.tensors.values())).device if weights.tensors else torch.device("cpu")
    model.to(target)  # moves only the real buffers; parameters are already there
    model.eval()
    t3 = time.perf_counter()
    return model, LoadReport(weights.source, t2 - t1, (t1 - t0) + (t3 - t2), weights.reason, weights.key.short,
                             engine)


def build_on_meta(model_dir: str | os.PathLike[str], dtype: torch.dtype, *, impl: str) -> tuple[torch.nn.Module, str]:
    """The model with parameters on the meta device, and which implementation built it."""
    if impl != "transformers":
        from .native import Decoder, reason_unsupported

        hf_config = json.loads((Path(model_dir) / "config.json").read_text())
        reason = reason_unsupported(hf_config)
        if reason is None:
            return Decoder.on_meta(hf_config, dtype), "native"
        if impl == "native":
            raise ValueError(f"the native decoder does not cover this model ({reason}); use --model-impl auto "
                             f"or transformers")
        logger.info("the native decoder does not cover this model (%s); building it with transformers", reason)
    from transformers import AutoConfig, AutoModelForCausalLM

    with meta_parameters():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    return model, "transformers"


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
    start = time.perf_counter()
    model, report = load_model(model_dir, dtype=dtype, device=device, config=config, load_format=load_format)
    from transformers import AutoTokenizer  # after the weights: a strict miss fails without this import
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model.device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new = out[0, ids.shape[1]:]
    return Generated(tokenizer.decode(new, skip_special_tokens=True), new.tolist(), report,
                     time.perf_counter() - start)
