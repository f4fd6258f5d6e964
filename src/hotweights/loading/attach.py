"""Engine side: attach an entry (fds -> mapped pools -> named tensors).

``attach_tensors`` returns an ``AttachResult`` whose outcome is ``ok``, ``miss``,
``mismatch``, ``absent`` or ``unusable``; the fallback policy (``policy.py``) reads it
and logs. Expected outcomes are values; only broken invariants raise (``WrongEntry``).

Lifetime: the fds from the daemon are closed as soon as each pool is mapped; the
mapping lives as long as any tensor view over it (each view holds its pool's base).
Once an engine installs the views as its parameters (``engines/modules.py``), the model
keeps the weights alive: an engine keeps working when the daemon dies.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .. import evidence
from ..client import Outcome, backoff, connect_for, is_transient
from ..config import AttachConfig
from ..errors import DaemonUnavailable, PoolError, ProtocolError, TrustError, WrongEntry
from ..evidence import GIB
from ..key import CacheKey, FieldDiff
from ..manifest import Manifest, PoolSpec
from ..pools import ALIGN_BYTES, backend, tensor_views
from ..wire import close_fds
from . import resident

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AttachResult:
    outcome: Outcome
    reason: str = ""
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    manifest: Manifest | None = None
    diffs: tuple[FieldDiff, ...] = ()
    socket_path: str = ""
    mode: str = ""  # zero_copy: the tensors are views of the pools; copy: engine-owned

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


def attach_tensors(key: CacheKey, config: AttachConfig | None = None, *, evidence_mode: str | None = None,
                   clock: Callable[[str], object] | None = None) -> AttachResult:
    """Ask the daemon for ``key`` and map it (zero_copy) or clone it (copy).

    connect -> attach -> map the pools (copy mode: start the copies) -> validate the
    reply while the GPU copies -> views. ``evidence_mode`` names the mode in the Mapped
    line when the caller uses the tensors another way (the vLLM plugin streams them
    into vLLM's loaders: ``stream``). ``clock(phase)`` is called as each phase of an ok attach
    ends, for benchmarks: connect, request (reply + fds), map (import and map every pool;
    copy mode also issues the copies), decode (validate the manifest while the copies
    run), views, wait (copy mode: the copies).
    """
    config = config or AttachConfig()
    tick = clock or (lambda _: None)
    start = time.perf_counter()
    deadline = time.monotonic() + config.connect_timeout_s
    for attempt in itertools.count():
        try:
            client = connect_for(config)
        except DaemonUnavailable as exc:
            return AttachResult(Outcome.ABSENT, f"daemon unavailable: {exc}")
        except TrustError as exc:
            return AttachResult(Outcome.ABSENT, f"untrusted daemon: {exc}")
        tick("connect")
        with client:
            socket_path = str(client.socket_path)
            try:
                reply = client.attach(key)
                tick("request")
                mapped = _map_pools(reply.pools, reply.take_fds(), copy=config.mode == "copy") if reply.pools else None
                tick("map")
                answer = reply.answer()
                break
            except PoolError as exc:
                return AttachResult(Outcome.UNUSABLE, str(exc), socket_path=socket_path)
            except WrongEntry:
                raise  # a broken invariant, not an outcome
            except (ProtocolError, OSError) as exc:
                if is_transient(exc) and time.monotonic() < deadline:  # the connection broke: ask again
                    backoff(attempt)
                    continue
                # the daemon answered the connect: no word here about what it holds
                return AttachResult(Outcome.ABSENT, f"daemon unavailable: the attach failed in transit after "
                                                    f"{attempt + 1} tries ({exc})", socket_path=socket_path)
    if answer.outcome is not Outcome.OK:
        return AttachResult(answer.outcome, answer.reason, diffs=answer.diffs, socket_path=socket_path)
    manifest = answer.manifest
    tick("decode")
    tensors = tensor_views(manifest, mapped.flat)  # built while copies are still running
    tick("views")
    mapped.wait()
    tick("wait")
    if config.mode == "zero_copy":  # a deep park unmaps and maps again what is recorded here
        resident.record(key, manifest, mapped.flat, config)
    ms = (time.perf_counter() - start) * 1e3
    logger.info(evidence.mapped(len(manifest.tensors), manifest.tensor_nbytes, socket_path,
                                evidence_mode or config.mode, ms))
    return AttachResult(Outcome.OK, tensors=tensors, manifest=manifest, socket_path=socket_path, mode=config.mode)


@dataclass(slots=True)
class _Mapped:
    flat: list[torch.Tensor]  # one flat uint8 tensor per pool: the mapping, or its copy
    sources: list[torch.Tensor]  # copy mode on the GPU: mappings kept until their copies end

    def wait(self) -> None:
        if self.sources:
            torch.cuda.current_stream(self.flat[0].device).synchronize()
        self.sources.clear()


def _map_pools(pools: list[PoolSpec], fds: list[int], *, copy: bool) -> _Mapped:
    """Map (or map and clone) every pool; the fds are closed on every path."""
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
            raise PoolError(f"copy mode needs {starts[-1] / GIB:.2f} GiB on {device} but only "
                            f"{free / GIB:.2f} GiB is free; use mode=zero_copy or free memory")
    mapped = _Mapped([], [])
    for i, (fd, spec) in enumerate(zip(fds, pools)):
        try:
            view = impl.import_pool(fd, spec)
        except BaseException:
            close_fds(fds[i + 1:])
            raise
        if not copy:
            mapped.flat.append(view)
            continue
        if owned is None:  # one allocation for every pool: no per-pool allocator calls
            owned = torch.empty(starts[-1], dtype=torch.uint8, device=view.device)
        dst = owned[starts[i]: starts[i] + spec.nbytes]
        # async on the GPU: pool i copies while pool i + 1 is imported
        dst.copy_(view, non_blocking=True)
        mapped.flat.append(dst)
        if owned.is_cuda:
            mapped.sources.append(view)
    return mapped
