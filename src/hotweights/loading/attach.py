"""Engine side: attach an entry (fds -> mapped pools -> named tensors) and fill a module.

``attach_tensors`` returns an ``AttachResult`` whose status is ``ok``, ``miss``,
``mismatch``, ``absent`` or ``unusable``; the fallback policy (``policy.py``) reads it
and logs. Expected outcomes are values; only broken invariants raise.

Lifetime: the fds from the daemon are closed as soon as each pool is mapped; the
mapping lives as long as any tensor view over it (each view holds its pool's base).
After ``attach_module`` the module's parameters are those views, so the module keeps
the weights alive: an engine keeps working when the daemon dies.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import evidence
from ..client import wait_for_daemon
from ..config import AttachConfig
from ..errors import DaemonUnavailable, ManifestError, PoolError, ProtocolError
from ..key import CacheKey
from ..manifest import Manifest, PoolSpec
from ..paths import daemon_paths
from ..pools import ALIGN_BYTES, backend, tensor_views
from ..protocol import AttachMismatch, AttachMiss, close_fds

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AttachResult:
    status: str  # ok | miss | mismatch | absent | unusable
    reason: str = ""
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    manifest: Manifest | None = None
    diffs: tuple[str, ...] = ()
    socket_path: str = ""
    ms: float = 0.0
    # wall-clock ms per phase of an ok attach: connect, request (reply + fds), map (import and
    # map every pool; copy mode also issues the copies), decode (validate the manifest, which
    # runs while the copies do), views (tensors over the pools), wait (copy mode: until the
    # copies end)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def attach_tensors(key: CacheKey, config: AttachConfig | None = None, *,
                   evidence_mode: str | None = None) -> AttachResult:
    """Ask the daemon for ``key`` and map it (zero_copy) or clone it (copy).

    ``evidence_mode`` names the mode in the Mapped line when the caller uses the tensors
    another way (the vLLM plugin streams them into vLLM's loaders: ``stream``).
    """
    config = config or AttachConfig()
    start = time.perf_counter()
    paths = daemon_paths(config.socket_dir)
    try:
        client = wait_for_daemon(paths, socket_path=config.socket_path, connect_timeout_s=config.connect_timeout_s,
                                 state_timeout_s=0.0 if config.fallback else config.state_timeout_s)
    except DaemonUnavailable as exc:
        return AttachResult("absent", f"daemon unavailable: {exc}")
    marks = {"connect": time.perf_counter()}
    copy = config.mode == "copy"
    want_device = "cpu" if key.device_kind == "cpu" else f"{key.device_kind}:{key.device_id}"
    given: list[PoolSpec] = []

    def on_pools(pools: list[PoolSpec], fds: list[int]) -> tuple[list[torch.Tensor], Callable[[], None]]:
        # map (and in copy mode start copying) before the manifest is validated: the GPU
        # copies while the CPU checks the manifest and builds the views
        marks["request"] = time.perf_counter()
        given.extend(pools)
        if any(p.device != want_device for p in pools):
            close_fds(fds)
            raise ProtocolError(f"daemon answered pools on {pools[0].device} for a key on {want_device}",
                                code="wrong_entry")
        return _map_pools(pools, fds, copy=copy, marks=marks)

    with client:
        socket_path = str(client.socket_path)
        try:
            reply, mapped = client.attach_pipelined(key, on_pools)
        except PoolError as exc:
            return AttachResult("unusable", str(exc), socket_path=socket_path)
        except (ProtocolError, OSError) as exc:
            if getattr(exc, "code", "") == "wrong_entry":  # a broken invariant, not an outcome
                raise
            return AttachResult("absent", f"daemon failed the attach: {exc}", socket_path=socket_path)
    if isinstance(reply, AttachMiss):
        return AttachResult("miss", f"cache miss for {key.model} [{key.short}]: {reply.reason}",
                            socket_path=socket_path)
    if isinstance(reply, AttachMismatch):
        reason = f"cached entry {reply.model} [{reply.key_short}] differs: " + "; ".join(reply.diffs)
        return AttachResult("mismatch", reason, diffs=tuple(reply.diffs), socket_path=socket_path)
    manifest = reply.manifest
    flat, finish = mapped
    # the daemon must never serve another key, nor other pools than those just mapped
    if manifest.key != key or list(manifest.pools) != given:
        finish()
        raise ProtocolError(f"daemon answered key {manifest.key.short} for {key.short}", code="wrong_entry")
    marks["decode"] = time.perf_counter()
    tensors = tensor_views(manifest, flat)  # built while copies are still running
    marks["views"] = time.perf_counter()
    finish()
    end = time.perf_counter()
    ms = (end - start) * 1e3
    marks["wait"] = end
    phases, previous = {}, start
    for name, at in marks.items():
        phases[name], previous = round((at - previous) * 1e3, 3), at
    logger.info(evidence.mapped(len(manifest.tensors), manifest.tensor_nbytes, socket_path,
                                evidence_mode or config.mode, ms))
    return AttachResult("ok", tensors=tensors, manifest=manifest, socket_path=socket_path, ms=ms, phases=phases)


def _map_pools(pools: list[PoolSpec], fds: list[int], *, copy: bool,
               marks: dict[str, float]) -> tuple[list[torch.Tensor], Callable[[], None]]:
    """Map (or map and clone) every pool; the returned ``finish`` waits for the clones."""
    device = pools[0].device
    impl = backend(device)
    owned: torch.Tensor | None = None
    starts = [0]
    for pool in pools:
        starts.append(starts[-1] + -(-pool.nbytes // ALIGN_BYTES) * ALIGN_BYTES)
    if copy:
        free = impl.available_bytes(device)
        if starts[-1] > free:
            close_fds(fds)
            raise PoolError(f"copy mode needs {starts[-1] / 2**30:.2f} GiB on {device} but only "
                            f"{free / 2**30:.2f} GiB is free; use mode=zero_copy or free memory")
    flat: list[torch.Tensor] = []
    sources: list[torch.Tensor] = []  # mappings stay alive until their async copies are done
    for i, (fd, spec) in enumerate(zip(fds, pools)):
        try:
            view = impl.import_pool(fd, spec)
        except BaseException:
            close_fds(fds[i + 1:])
            raise
        if not copy:
            flat.append(view)
            continue
        if owned is None:  # one allocation for every pool: no per-pool allocator calls
            owned = torch.empty(starts[-1], dtype=torch.uint8, device=view.device)
        dst = owned[starts[i]: starts[i] + spec.nbytes]
        # async on the GPU: pool i copies while pool i + 1 is imported
        dst.copy_(view, non_blocking=True)
        flat.append(dst)
        if owned.is_cuda:
            sources.append(view)
    marks["map"] = time.perf_counter()

    def finish() -> None:
        if owned is not None and owned.is_cuda:
            torch.cuda.current_stream(owned.device).synchronize()
        sources.clear()

    return flat, finish


@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
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


def attach_module(module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Make ``tensors`` the parameters and persistent buffers of ``module``, without copies.

    Tied parameters (one object under several names) stay one object. Every missing
    name and every shape/dtype disagreement is reported at once.
    """
    slots: dict[int, list[tuple[nn.Module, str, str, bool]]] = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for leaf, p in owner._parameters.items():
            if p is not None:
                slots.setdefault(id(p), []).append((owner, leaf, f"{prefix}.{leaf}" if prefix else leaf, True))
        for leaf, b in owner._buffers.items():
            if b is not None and (leaf not in owner._non_persistent_buffers_set or b.device.type == "meta"):
                slots.setdefault(id(b), []).append((owner, leaf, f"{prefix}.{leaf}" if prefix else leaf, False))
    problems: list[str] = []
    used: set[str] = set()
    plan: list[tuple[list[tuple[nn.Module, str, str, bool]], torch.Tensor]] = []
    for places in slots.values():
        names = [full for _, _, full, _ in places]
        found = next((n for n in names if n in tensors), None)
        if found is None:
            problems.append(f"missing {names[0]}")
            continue
        tensor = tensors[found]
        used.update(n for n in names if n in tensors)
        current = getattr(places[0][0], places[0][1])
        if tuple(current.shape) != tuple(tensor.shape) or current.dtype != tensor.dtype:
            problems.append(f"{found}: model expects {tuple(current.shape)} {current.dtype}, "
                            f"cache has {tuple(tensor.shape)} {tensor.dtype}")
            continue
        plan.append((places, tensor))
    if problems:
        more = f"; ... and {len(problems) - 8} more" if len(problems) > 8 else ""
        raise ManifestError(f"{len(problems)} cached tensors do not fit {type(module).__name__}: "
                            + "; ".join(problems[:8]) + more)
    unused = sorted(set(tensors) - used)
    if unused:
        logger.warning("cached tensors not used by the model: count=%d first=%s", len(unused), unused[:3])
    for places, tensor in plan:
        param = nn.Parameter(tensor, requires_grad=False) if places[0][3] else tensor
        for owner, leaf, _, is_param in places:
            (owner._parameters if is_param else owner._buffers)[leaf] = param
