"""What the installed vLLM can do for the plugin, detected from its code, never its version.

- ``weights_already_processed`` (``vllm.model_executor.utils``, vLLM >= 0.3x): reruns
  ``process_weights_after_loading`` without transforming weights, which quantization
  methods need before an engine-layout entry can be attached. Without it, an unquantized
  model's post-processing is replayed as is (it transforms nothing on the GPU; the
  tensors it writes are the engine's own copies, see ``engines/writes.py``), and an engine-layout
  entry of a quantized model is not attached: the checkpoint layout is streamed instead.
- ``get_external_weight_memory`` (on ``BaseModelLoader``, with ``request_memory`` taking
  ``external_weight_memory``): vLLM counts weights held outside the engine against its
  ``--gpu-memory-utilization`` budget. Without it, ``budget.py`` supplies the same
  accounting.

``detect()`` imports vLLM; ``missing_line()`` is the one start-up line that names what is
missing and what works instead.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Capabilities:
    version: str
    weights_already_processed: Any  # the context manager, or None
    external_weight_memory: bool  # vLLM itself asks the loader and budgets for it

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(name for name, have in (("weights_already_processed", self.weights_already_processed),
                                             ("get_external_weight_memory", self.external_weight_memory)) if not have)


def detect() -> Capabilities:
    import vllm

    utils = importlib.import_module("vllm.model_executor.utils")
    base = importlib.import_module("vllm.model_executor.model_loader.base_loader").BaseModelLoader
    worker_utils = importlib.import_module("vllm.v1.worker.utils")
    request_memory = getattr(worker_utils, "request_memory", None)
    takes_external = request_memory is not None and "external_weight_memory" in inspect.signature(
        request_memory).parameters
    return Capabilities(str(getattr(vllm, "__version__", "unknown")), getattr(utils, "weights_already_processed", None),
                        hasattr(base, "get_external_weight_memory") and takes_external)


def missing_line(caps: Capabilities) -> str | None:
    """One line naming what this vLLM lacks and what hotweights does instead; None if nothing."""
    if not caps.missing:
        return None
    what = []
    if caps.weights_already_processed is None:
        what.append("weights_already_processed (engine-layout entries of quantized models are not attached; "
                    "use layout checkpoint for them, which streams into vLLM's own loaders)")
    if not caps.external_weight_memory:
        what.append("get_external_weight_memory (hotweights budgets the mapped weights itself)")
    return f"vLLM {caps.version} lacks " + "; ".join(what)


def engine_layout_refusal(caps: Capabilities, quantization: str | None) -> str | None:
    """Why this vLLM cannot attach an engine-layout entry of this model safely, or None."""
    if quantization and caps.weights_already_processed is None:
        return (f"vLLM {caps.version} lacks weights_already_processed, so a {quantization} engine-layout entry "
                f"would be post-processed twice; use --model-loader-extra-config '{{\"layout\": \"checkpoint\"}}' "
                f"(streamed into vLLM's loaders) or a vLLM that has it")
    return None
