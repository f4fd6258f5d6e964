"""vLLM's CPU build packs unquantized linear weights into oneDNN handles during
post-processing and drops the weight tensors; this shim keeps them for publishing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def keep_cpu_packed_weights() -> Iterator[dict[int, Any]]:
    """While active, remember each weight vLLM's CPU GEMM dispatch is about to drop.

    Yields ``id(layer) -> weight`` (the tensor as loaded, before oneDNN/sgl packing).
    """
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    kept: dict[int, Any] = {}

    def dispatch(layer, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if remove_weight and weight is not None and not weight.is_meta:
            kept[id(layer)] = weight.data
        original(layer, remove_weight)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch
    try:
        yield kept
    finally:
        layer_utils.dispatch_cpu_unquantized_gemm = original
