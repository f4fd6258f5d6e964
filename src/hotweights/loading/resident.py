"""The keeper's weights this process maps: unmapped in a deep park, mapped again at the same addresses.

Every zero-copy attach is recorded here (``record``: the entry's key, manifest and flat pool tensors).
``unmap_all`` lets go of every pool's memory but keeps its address range (``pools/cuda.py``: the VA
reservation; ``pools/cpu.py``: an inaccessible placeholder), so every tensor view, and every CUDA graph
that captured a pointer into them, is valid again once ``map_again`` has mapped the same bytes there:

- from the keeper's entry of the same key (its manifest must be the one mapped before: same tensors at
  the same offsets of pools of the same sizes): the source is ``gpu`` (or ``host`` for a cpu entry);
- else from the key's host copy (``keeper/registry.py``): a new allocation on the entry's device, mapped
  at the same addresses, is filled from it (``upload.py``) and published back as the entry (the next
  engine shares it; when another waking engine published it first, ours is unmapped and that one mapped,
  so one key never stands for two copies): the source is ``host``. Where the host copy was there when the entry
  was unmapped, it was pinned then, in a thread (``upload.Pinned``: mapped shared, read-only, registered with
  CUDA; ~1 s per 16 GiB, off the wake's path), and the wake is one DMA from it; else the upload goes through
  pinned stages. The pinning outlives the wake: letting go of 16 GiB of pinned pages while vLLM wakes held its
  own wake back (0.03 s became 0.4-0.76 s on an H200), and the next deep park needs it again. Each deep park,
  and each wake, checks that it is still the keeper's host copy (``upload.identity``); one that is not, or
  that the keeper no longer has, is let go of then, so a host copy the keeper dropped stays alive in an engine
  until that engine's next park or wake (or its stop) at most;
- else ``WeightsGone``, and nothing was mapped: the caller stays parked and says what to do.

Copies between the keeper's tiers (``host_copy``, ``promote``) are ``tiers.py``'s. While unmapped, nothing may
read the weights: a kernel or a tensor access over them faults.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..client import Client, connect_for
from ..config import AttachConfig
from ..errors import HotweightsError, ProtocolError
from ..key import CacheKey
from ..manifest import Manifest
from ..pools import backend
from ..replies import Outcome
from ..wire import close_fds
from . import upload

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class WeightsGone(HotweightsError):
    """The keeper no longer has these weights in any tier (or has other ones); the message says what to do."""


@dataclass(slots=True)
class Held:
    """One entry this process maps: the address of each of its pools."""

    key: CacheKey
    manifest: Manifest
    addresses: list[int]
    config: AttachConfig
    mapped: bool = True
    pinning: threading.Thread | None = None  # pins the host copy while unmapped (``_pin_ahead``)
    pinned: list[upload.Pinned] | None = None  # one per pool, for the wake

    def alive(self) -> bool:
        """Some view of its pools is left (the mappings live while a view does)."""
        impl = backend(self.manifest.key.device)
        return all(impl.is_mapped_here(a) for a in self.addresses)


_HELD: list[Held] = []
_LOCK = threading.Lock()
PIN_AHEAD = True  # pin the host copy while unmapped (benchmarks/host_wake_profile.py turns it off to compare)
QUEUED_COPIES = True  # a pinned wake queues every pool's DMA, then waits once (host_wake_profile.py compares)


@dataclass(frozen=True, slots=True)
class Remapped:
    """What ``map_again`` did: where the bytes came from (``gpu``, ``host``, ``gpu+host``; '' if nothing was
    unmapped), and the bytes copied from a host copy and the seconds that took."""

    source: str
    host_bytes: int = 0
    host_s: float = 0.0

    def rate(self) -> str:
        """``16.40 GB at 47.1 GB/s`` for a wake from a host copy, else ''."""
        if not self.host_bytes or self.host_s <= 0:
            return ""
        return f"{self.host_bytes / 1e9:.2f} GB at {self.host_bytes / self.host_s / 1e9:.1f} GB/s"


def record(key: CacheKey, manifest: Manifest, flat: list[torch.Tensor], config: AttachConfig) -> None:
    """A zero-copy attach of ``key``: ``flat`` are its mapped pools, in manifest order. An entry let go of
    earlier whose address range the new one was given is dropped: it looks alive again at its old addresses."""
    new = Held(key, manifest, [t.data_ptr() for t in flat], config)
    taken = _ranges(new)
    _keep(lambda h: h.alive() and not _overlap(_ranges(h), taken), new)


def _ranges(h: Held) -> list[tuple[int, int]]:
    return [(a, a + spec.nbytes) for a, spec in zip(h.addresses, h.manifest.pools)]


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(lo < b_hi and b_lo < hi for lo, hi in a for b_lo, b_hi in b)


def held() -> list[Held]:
    """The entries this process still maps (or keeps unmapped for a wake). Those let go of are forgotten
    here, so that a later mapping at their addresses does not bring them back."""
    return _keep(Held.alive)


def _keep(alive: Callable[[Held], bool], new: Held | None = None) -> list[Held]:
    """The held entries for which ``alive`` holds (and ``new``, added): the others are forgotten, and a host
    copy pinned for one of them let go of."""
    kept: list[Held] = []
    gone: list[Held] = []
    with _LOCK:
        for h in _HELD:
            (kept if alive(h) else gone).append(h)
        _HELD[:] = [*kept, new] if new is not None else kept
        kept = list(_HELD)
    for h in gone:
        _unpin(h)
    return kept


def mapped_bytes() -> int:
    return sum(h.manifest.nbytes for h in held() if h.mapped)


def unmap_all() -> int:
    """Unmap every held entry, keeping the addresses; the bytes let go of. A GPU entry's wake may come from a
    host copy: its host copy is pinned meanwhile, where there is one, else the upload's pinned staging is made
    ready (``upload.warm_stages``)."""
    freed = 0
    for h in held():
        if not h.mapped:
            continue
        for address, spec in zip(h.addresses, h.manifest.pools):
            backend(spec.device).unmap(address, spec)
        h.mapped = False
        freed += h.manifest.nbytes
        if h.manifest.key.device != "cpu":
            from ..pools.devices import index_of_uuid

            index = index_of_uuid(h.manifest.key.device.split(":", 1)[1])
            if PIN_AHEAD:
                h.pinning = threading.Thread(target=_pin_ahead, args=(h, index), name="hotweights-pin-copy",
                                             daemon=True)
                h.pinning.start()
            else:
                upload.warm_stages(index)
    return freed


def _pin_ahead(h: Held, index: int) -> None:
    """Pin ``h``'s host copy for its wake (``upload.Pinned``; kept where the one pinned before is still the
    keeper's), or, where the keeper has none (or it cannot be pinned), ready the upload's staging instead."""
    import torch

    torch.cuda.set_device(index)
    began = time.perf_counter()
    try:
        with connect_for(h.config) as client, _attached(client, h, "host") as fds:
            if fds is not None and _pinned_is(h, fds):
                return
            _unpin(h)
            if fds is not None:
                pinned: list[upload.Pinned] = []
                try:
                    for fd, spec in zip(fds, h.manifest.pools):
                        pinned.append(upload.Pinned(fd, spec.nbytes))
                except BaseException:
                    for p in pinned:
                        p.close()
                    raise
                h.pinned = pinned
                logger.info("hotweights: the host copy of %s [%s] pinned for its wake (%.2f GiB in %.2f s)",
                            h.key.model, h.key.short, h.manifest.nbytes / 2**30, time.perf_counter() - began)
                return
    except (HotweightsError, OSError) as exc:
        logger.info("hotweights: the host copy of %s [%s] not pinned ahead (%s): a wake from it uploads through "
                    "pinned stages", h.key.model, h.key.short, exc)
    upload.warm_stages(index)


def _pinned_is(h: Held, fds: list[int]) -> bool:
    """Whether ``h``'s pinned host copy is the one the keeper handed over now, as ``fds``."""
    return h.pinned is not None and [p.identity for p in h.pinned] == [upload.identity(fd) for fd in fds]


def _unpin(h: Held) -> None:
    """Let go of ``h``'s pinned host copy (unregistering 16 GiB takes a moment: in a thread, off the wake)."""
    if h.pinning is not None and h.pinning is not threading.current_thread():
        h.pinning.join()
        h.pinning = None
    pinned, h.pinned = h.pinned, None
    if pinned:
        threading.Thread(target=lambda: [p.close() for p in pinned], name="hotweights-unpin", daemon=True).start()


def map_again() -> Remapped:
    """Map every unmapped entry again at its addresses; where the bytes came from, and how fast a host copy's
    came. WeightsGone (nothing of that entry mapped) otherwise."""
    sources: set[str] = set()
    host_bytes, host_s = 0, 0.0
    for h in held():
        if h.mapped:
            continue
        began = time.perf_counter()
        source = _map_again(h)
        sources.add(source)
        if source == "host" and h.manifest.key.device != "cpu":
            host_bytes, host_s = host_bytes + h.manifest.nbytes, host_s + time.perf_counter() - began
    return Remapped("+".join(sorted(sources)), host_bytes, host_s)


def _source(manifest: Manifest) -> str:
    return "host" if manifest.key.device == "cpu" else "gpu"


def _map_again(h: Held) -> str:
    if h.pinning is not None:
        h.pinning.join()  # (a wake right after its park waits for the pinning: ~1 s per 16 GiB)
    try:
        with connect_for(h.config) as client:
            if _from_entry(client, h):
                return _source(h.manifest)
            copied = _from_host_copy(client, h)
            if copied:
                return "host"
            if copied is False and _from_entry(client, h):  # another engine brought it back first
                return _source(h.manifest)
    except (HotweightsError, OSError) as exc:
        _unpin(h)
        if isinstance(exc, WeightsGone):
            raise
        raise WeightsGone(f"cannot map {h.key.model} [{h.key.short}] again: {exc}") from None
    _unpin(h)  # the keeper has no host copy left: the pinned one goes too
    raise WeightsGone(f"the keeper holds neither {h.key.model} [{h.key.short}] nor a host copy of it "
                      f"(released?): preload it again (hotweights preload) and wake this engine, or stop it")


@contextlib.contextmanager
def _attached(client: Client, h: Held, tier: str) -> Generator[list[int] | None, None, None]:
    """The fds of ``tier``'s copy of ``h.key`` (laid out as ``h`` was, else WeightsGone), None when the keeper
    has none; a taken fd is set to -1 by the caller, the others are closed on the way out."""
    reply = client.attach(h.key, tier=tier)
    fds = reply.take_fds() if reply.pools else []
    try:
        answer = reply.answer()
        if answer.outcome is not Outcome.OK:
            yield None
        else:
            _same_layout(h, answer.manifest)
            yield fds
    finally:
        close_fds([fd for fd in fds if fd >= 0])


def _from_entry(client: Client, h: Held) -> bool:
    """Map the keeper's entry of ``h.key`` at ``h``'s addresses; False when it holds none."""
    with _attached(client, h, "device") as fds:
        if fds is None:
            return False
        for i, (address, spec) in enumerate(zip(h.addresses, h.manifest.pools)):
            fd, fds[i] = fds[i], -1
            backend(spec.device).remap(address, fd, spec)
    h.mapped = True
    return True


def _from_host_copy(client: Client, h: Held) -> bool | None:
    """Fill a new entry of ``h.key`` from its host copy at ``h``'s addresses and publish it: True; None when
    there is no copy; False when another process published the entry first (nothing is left mapped: the
    caller maps that one)."""
    from ..pools import cpu

    with _attached(client, h, "host") as fds:
        if fds is None:
            return None
        device = backend(h.manifest.key.device)
        exported: list[int] = []
        if h.pinned is not None and not _pinned_is(h, fds):
            _unpin(h)  # pinned from a host copy the keeper has since replaced
        try:
            for i, (address, spec) in enumerate(zip(h.addresses, h.manifest.pools)):
                cpu.check_size(fds[i], spec)  # read straight from the fd: no 16 GiB mapping to fault in and drop
                if h.pinned is not None:  # pinned while parked: one DMA, queued (each pool sealed below)
                    copy = functools.partial(h.pinned[i].copy_to, wait=not QUEUED_COPIES)
                    exported.append(device.fill_at(address, spec, copy, wait=not QUEUED_COPIES))
                else:
                    exported.append(device.fill_at(address, spec, lambda dst, fd=fds[i]: upload.upload(fd, dst)))
            if h.pinned is not None and QUEUED_COPIES:  # the DMAs run back to back, not each behind the next
                for address, spec in zip(h.addresses, h.manifest.pools):  # pool's allocation and a wait
                    device.seal_at(address, spec)
            client.publish(h.manifest, exported)
        except BaseException as exc:
            for address, spec in zip(h.addresses[:len(exported)], h.manifest.pools):
                device.unmap(address, spec)
            if isinstance(exc, ProtocolError) and exc.code == "exists":
                return False  # another engine brought it back first: map that one (one key, one copy)
            raise
        finally:
            close_fds(exported)
    h.mapped = True
    return True


def _same_layout(h: Held, manifest: Manifest | None) -> None:
    if manifest is None or (manifest.tensors, manifest.pools) != (h.manifest.tensors, h.manifest.pools):
        raise WeightsGone(f"the keeper's entry {h.key.short} is laid out differently from the one this engine "
                          f"mapped: stop this engine and start it again")


def forget_unmapped() -> None:
    """Drop the entries left unmapped (the engine took other weights): their address ranges go with them."""
    with _LOCK:
        for h in _HELD:
            if not h.mapped:
                _unpin(h)
        _HELD[:] = [h for h in _HELD if h.mapped]


def announce(level: int, held_bytes: int) -> None:
    """Tell the keeper of each held entry that this process is parked at ``level`` (0: awake) holding
    ``held_bytes`` of its own (counted once, on the first entry); a keeper that cannot be told is logged."""
    for i, h in enumerate(held()):
        try:
            with connect_for(h.config) as client:
                client.park(h.key, level, held_bytes if i == 0 else 0)
        except (HotweightsError, OSError) as exc:
            logger.warning("could not tell the weight cache daemon that this engine is %s: %s",
                           "parked" if level else "awake", exc)
