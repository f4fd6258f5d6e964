"""Keep an engine from writing into zero-copy weights, without waiting for a crash to learn it.

Engine-agnostic (torch only); vLLM's loader is its user, and vLLM's writes are the examples.
GPU mappings of the daemon's pools are read-only: one write ends the engine's CUDA context
(``cudaErrorIllegalAddress``). vLLM writes into some tensors it holds while it
post-processes a loaded model: attention layers ``fill_`` their ``_k_scale``/``_v_scale``/
``_q_scale``/``_prob_scale`` buffers (vLLM 0.26, and any version that replays
``process_weights_after_loading`` in full), quantization methods may ``copy_`` into
their parameters, and a forward pass may update buffers (``calc_kv_scales``). So:

- ``own_buffers(model, mapped)``: every buffer that is a view of a pool becomes an
  engine-owned clone (buffers are small: scales, rotary caches); parameters stay mapped.
- ``WriteGuard(mapped)``: a ``TorchDispatchMode`` that, while active, refuses any aten
  op that would write into a mapped pool (the op's schema marks the argument as
  written), raising ``ZeroCopyWrite`` that names the op and the tensor's shape, before
  the write reaches the GPU. The loader runs post-processing under it and, on refusal,
  attaches the entry by copy instead.

``mapped`` is the set of pool storages: ``storages(tensors)``.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import HotweightsError


class ZeroCopyWrite(HotweightsError):
    """vLLM was about to write into a tensor that is a read-only view of the cache."""


def storages(tensors) -> frozenset[tuple[int, int]]:
    """``(data_ptr, nbytes)`` of every storage under ``tensors`` (the mapped pools)."""
    return frozenset((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors)


def _in(t: torch.Tensor, mapped: frozenset[tuple[int, int]]) -> bool:
    if t.is_meta or not mapped:
        return False
    ptr = t.untyped_storage().data_ptr()
    return any(start <= ptr < start + size for start, size in mapped)


def own_buffers(model: torch.nn.Module, mapped: frozenset[tuple[int, int]]) -> int:
    """Replace every buffer that views a pool with an engine-owned clone; returns how many."""
    clones: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for leaf, b in module._buffers.items():
            if b is not None and _in(b, mapped):
                clone = clones.get(id(b))
                if clone is None:
                    clone = clones[id(b)] = b.clone()
                module._buffers[leaf] = clone
    return len(clones)


class WriteGuard(TorchDispatchMode):
    def __init__(self, mapped: frozenset[tuple[int, int]]) -> None:
        super().__init__()
        self.mapped = mapped

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and _in(t, self.mapped):
                    raise ZeroCopyWrite(f"{func.__name__} would write into a zero-copy weight of shape "
                                        f"{tuple(t.shape)} {t.dtype}")
        return func(*args, **kwargs)
