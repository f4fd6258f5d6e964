"""Copies between the keeper's tiers, made by a process with the device's context (the keeper has none).

``host_copy`` publishes a host copy of every entry this process maps (``resident.held``) that has none: a host-tier
model's weights, kept in host memory once its engine parks. ``promote`` makes an entry's device copy again from its
host copy and publishes it (``hotweights promote``): a host-tier model's start then maps it.
"""

from __future__ import annotations

from ..client import Client
from ..errors import ProtocolError
from ..key import CacheKey
from ..manifest import Manifest
from ..pools import backend
from ..replies import Outcome
from ..wire import close_fds
from . import resident, upload
from .resident import WeightsGone

PINNED_DOWNLOAD = True  # a GPU entry's host copy by one DMA into registered pages (host_wake_profile.py compares)


def host_copy(client: Client, only: CacheKey | None = None) -> int:
    """Publish a host copy of every entry this process maps (or only ``only``) that has none; the bytes copied."""
    copied = 0
    from ..pools import cpu

    have = {row.key for row in client.status().rows() if row.host_nbytes}
    for h in resident.held():
        if not h.mapped or h.key.short in have or (only is not None and h.key != only):
            continue
        made = []
        for address, spec in zip(h.addresses, h.manifest.pools):
            host = cpu.create(spec.nbytes)
            source = backend(spec.device).view_at(address, spec)
            if PINNED_DOWNLOAD and source.is_cuda:
                upload.download(source, host.as_tensor())
            else:
                host.as_tensor().copy_(source)
            made.append(host)
        fds = [host.export() for host in made]
        try:
            client.publish(h.manifest, fds, tier="host")
        except ProtocolError as exc:
            if exc.code != "exists":
                raise
            continue
        finally:
            close_fds(fds)
        copied += h.manifest.nbytes
    return copied


def promote(client: Client, manifest: Manifest) -> int:
    """The device copy of ``manifest``'s entry made again from its host copy and published (``hotweights promote``),
    where only the host copy was left (a host-tier model after its park): an engine's start then maps it. The bytes
    uploaded: 0 where the device copy is there already, or another process published it first. WeightsGone where
    the keeper holds no host copy; nothing is left allocated on any failure."""
    from ..pools import cpu

    if client.lookup(manifest.key).outcome is Outcome.OK:
        return 0
    reply = client.attach(manifest.key, tier="host")
    fds = reply.take_fds() if reply.pools else []
    made: list[int] = []
    try:
        answer = reply.answer()
        if answer.outcome is not Outcome.OK or answer.manifest is None:
            raise WeightsGone(f"the keeper holds no host copy of {manifest.key.model} [{manifest.key.short}]: "
                              f"preload it again (hotweights preload)")
        host = answer.manifest
        for fd, spec in zip(fds, host.pools):
            cpu.check_size(fd, spec)
            pool = backend(spec.device).create(spec.nbytes, spec.device)
            try:
                upload.upload(fd, pool.as_tensor())
                made.append(pool.export())
            finally:
                pool.close()
        try:
            client.publish(host, made)
        except ProtocolError as exc:
            if exc.code == "exists":
                return 0  # another process brought it back first: one key, one copy
            raise
        return host.nbytes
    finally:
        close_fds([*fds, *made])
