"""Tensors <-> ``nn.Module``: one walk over a module's parameters and buffers, ties kept.

- ``meta_parameters()``: build a model with parameters on the meta device (no memory,
  no init) and real buffers.
- ``attach_module(module, tensors)``: install named tensors as the module's parameters
  and buffers, without copies. Tied parameters (one object under several names) stay
  one object. ``exact=True`` (transformers): every slot must be filled with the shape
  and dtype the model declares. ``exact=False`` (vLLM's engine layout, whose
  post-processing changes shapes and adds tensors): names without a slot become new
  parameters of their module, and only slots still on the meta device are missing.
- ``module_tensors(module)``: the inverse, for publishing what an engine ended up with.
- ``detach_module(module)``: every slot ``attach_module`` fills goes back to the meta device (a
  deep park: the module keeps no reference to the mapped weights, so their mapping can go).

Every problem is reported at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator
from typing import NamedTuple

import torch
from torch import nn

from ..errors import ManifestError

logger = logging.getLogger(__name__)


class Slot(NamedTuple):
    owner: nn.Module
    leaf: str
    name: str
    is_param: bool


def module_slots(module: nn.Module, *, all_buffers: bool = True) -> dict[int, list[Slot]]:
    """``id(tensor) -> every slot holding it``, in module order (ties: one key, several slots).

    Without ``all_buffers``, non-persistent buffers that are real (computed from the
    config, not in a checkpoint) are left out.
    """
    slots: dict[int, list[Slot]] = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for is_param, table in ((True, owner._parameters), (False, owner._buffers)):
            for leaf, t in table.items():
                if t is None or (not is_param and not all_buffers and leaf in owner._non_persistent_buffers_set
                                 and not t.is_meta):
                    continue
                slots.setdefault(id(t), []).append(Slot(owner, leaf, f"{prefix}.{leaf}" if prefix else leaf,
                                                        is_param))
    return slots


@contextlib.contextmanager
def meta_parameters() -> Generator[None, None, None]:
    """Build modules with parameters on the meta device (no memory, no init) but real buffers.

    Buffers such as rotary ``inv_freq`` are computed from the config and are not in a
    checkpoint, so they must exist for real; parameters come from the cache.
    """
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def attach_module(module: nn.Module, tensors: dict[str, torch.Tensor], *, exact: bool = True) -> None:  # noqa: C901, PLR0912
    """Make ``tensors`` the parameters and buffers of ``module``, without copies."""
    problems: list[str] = []
    used: set[str] = set()
    plan: list[tuple[list[Slot], torch.Tensor]] = []
    for places in module_slots(module, all_buffers=not exact).values():
        names = [slot.name for slot in places]
        found = next((n for n in names if n in tensors), None)
        current = getattr(places[0].owner, places[0].leaf)
        if found is None:
            if exact or current.is_meta:
                problems.append(f"missing {names[0]}")
            continue
        tensor = tensors[found]
        used.update(n for n in names if n in tensors)
        if exact and (tuple(current.shape) != tuple(tensor.shape) or current.dtype != tensor.dtype):
            problems.append(f"{found}: model expects {tuple(current.shape)} {current.dtype}, "
                            f"cache has {tuple(tensor.shape)} {tensor.dtype}")
            continue
        plan.append((places, tensor))
    unused = sorted(set(tensors) - used)
    if not exact:  # tensors that post-processing created: new parameters of their module
        modules = dict(module.named_modules(remove_duplicate=False))
        for name in unused:
            prefix, _, leaf = name.rpartition(".")
            if prefix not in modules:
                problems.append(f"{name} has no module in this model")
            else:
                plan.append(([Slot(modules[prefix], leaf, name, True)], tensors[name]))
        unused = []
    if problems:
        more = f"; ... and {len(problems) - 8} more" if len(problems) > 8 else ""
        raise ManifestError(f"{len(problems)} cached tensors do not fit {type(module).__name__}: "
                            + "; ".join(problems[:8]) + more)
    if unused:
        logger.warning("cached tensors not used by the model: count=%d first=%s", len(unused), unused[:3])
    made: dict[int, nn.Parameter] = {}
    for places, tensor in plan:
        for owner, leaf, _, is_param in places:
            if not is_param:
                owner._buffers[leaf] = tensor
                continue
            param = made.get(id(tensor))
            if param is None:  # tied weights: one view object -> one Parameter under every name
                param = made[id(tensor)] = nn.Parameter(tensor, requires_grad=False)
            owner._parameters[leaf] = param


def detach_module(module: nn.Module) -> int:
    """Put every slot that ``attach_module`` fills (exact mode) back on the meta device, same shape and dtype,
    ties kept; the bytes it let go of. ``attach_module`` fills them again."""
    freed = 0
    for places in module_slots(module, all_buffers=False).values():
        current = getattr(places[0].owner, places[0].leaf)
        if current.is_meta:
            continue
        freed += current.numel() * current.element_size()
        meta = torch.empty_like(current, device="meta")
        param = nn.Parameter(meta, requires_grad=False)
        for owner, leaf, _, is_param in places:
            if is_param:
                owner._parameters[leaf] = param
            else:
                owner._buffers[leaf] = meta
    return freed


def module_tensors(module: nn.Module, *, substitute: Callable[[Slot, torch.Tensor], torch.Tensor] | None = None
                   ) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, Slot]]:
    """(name -> tensor, alias -> name, name -> slot) of everything ``module`` holds.

    ``substitute(slot, tensor)`` may swap a tensor for the one to publish (vLLM's CPU
    packing leaves empty weights behind). Raises if a tensor is still on the meta device.
    """
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    owners: dict[str, Slot] = {}
    for places in module_slots(module).values():
        first = places[0]
        for slot in places:
            owners[slot.name] = slot
        for slot in places[1:]:
            aliases[slot.name] = first.name
        t = getattr(first.owner, first.leaf)
        if t.is_meta:
            raise ManifestError(f"{first.name} is still on the meta device after loading; cannot publish")
        data = t.data.detach()
        tensors[first.name] = substitute(first, data) if substitute else data
    return tensors, aliases, owners
