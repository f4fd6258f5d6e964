"""Shareable allocations ("pools") and tensor views over them.

Two backends share one set of verbs:

- ``create(nbytes, device) -> Pool``: a writable allocation in the loader;
  ``Pool.as_tensor()`` is a flat uint8 tensor over it; ``Pool.export()`` ends writing
  and returns the fd to publish (the pool object no longer owns it).
- ``import_pool(fd, spec) -> torch.Tensor``: the engine side. Takes the fd
  (and closes it), maps it and returns a flat uint8 tensor whose lifetime keeps the
  mapping alive: when the last view dies, the mapping goes.

``cpu`` is memfd + mmap (``pools/cpu.py``); ``cuda`` is CUDA VMM with POSIX-fd handles
(``pools/cuda.py``). ``tensor_views`` turns a manifest + mapped pools into named tensors.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..manifest import Manifest

ALIGN_BYTES = 256  # cudaMalloc alignment; also keeps every dtype aligned on the CPU


def backend(device: str) -> ModuleType:
    """The backend module for ``cpu`` or ``cuda:<uuid>``."""
    if device == "cpu":
        from . import cpu

        return cpu
    if device.startswith("cuda"):
        from . import cuda

        return cuda
    raise ValueError(f"unknown pool device {device!r}; use 'cpu' or 'cuda:<uuid>'")


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch has no dtype {name!r}")
    return dtype


def tensor_views(manifest: Manifest, pools: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Name -> tensor view over the mapped pools (aliases share the target's tensor).

    One ``as_strided`` per tensor over a typed view of its pool (the manifest checked
    that every offset is a multiple of the item size and every span fits its pool).
    """
    out: dict[str, torch.Tensor] = {}
    typed: dict[tuple[int, str], tuple[torch.Tensor, int]] = {}
    for spec in manifest.tensors:
        base = typed.get((spec.pool, spec.dtype))
        if base is None:
            pool, dtype = pools[spec.pool], torch_dtype(spec.dtype)
            usable = pool.numel() - pool.numel() % dtype.itemsize
            view = pool[:usable].view(dtype)
            base = typed[(spec.pool, spec.dtype)] = (view, int(view.storage_offset()))
        view, first = base
        out[spec.name] = view.as_strided(spec.shape, spec.stride, first + spec.offset // view.itemsize)
    for alias, target in manifest.aliases.items():
        out[alias] = out[target]
    return out
