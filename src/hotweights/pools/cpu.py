"""CPU pools: ``memfd`` + ``mmap``, shared between processes as file descriptors.

Writer (loader): ``memfd_create`` with sealing allowed, ``MAP_SHARED`` while filling;
``export`` unmaps, then seals the memfd against write, shrink and grow, so no process
(the loader included) can change the bytes after publish. The daemon refuses an
unsealed or wrongly sized memfd.

Reader (engine): ``MAP_PRIVATE`` with read+write protection. A write from an engine
lands in its own copy-on-write page: it cannot corrupt weights other engines share.

Lifetime: the memfd lives while any process holds an fd or a mapping. ``import_pool``
closes the fd it is given right after mapping; the mapping lives as long as the
returned tensor (torch keeps a reference to the ``mmap`` object).

A deep park (``unmap``/``remap``) keeps a mapping's address range: ``unmap`` puts an inaccessible
anonymous placeholder over it (the pool's pages go; a touch faults), ``remap`` maps a pool fd there
again (``MAP_FIXED``), so every tensor view over the range is valid again. The ``mmap`` object that
owns the range unmaps whatever is there when the last view goes.

Not covered: huge pages (pages are faulted in lazily on first touch).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import mmap
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..errors import PoolError
from ..manifest import PoolSpec

_MAPS: weakref.WeakValueDictionary[int, mmap.mmap] = weakref.WeakValueDictionary()  # address -> mapping
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class Pool:
    def __init__(self, nbytes: int, device: str = "cpu") -> None:
        if device != "cpu":
            raise PoolError(f"cpu pool asked for device {device!r}")
        self.nbytes = nbytes
        self.device = device
        self.fd = os.memfd_create("hotweights-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, nbytes)
            self._map: mmap.mmap | None = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED,
                                                    mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(self.fd)
            raise PoolError(f"cannot allocate a {nbytes}-byte cpu pool: {exc}") from None

    def as_tensor(self) -> torch.Tensor:
        if self._map is None:
            raise PoolError("pool was already exported")
        return torch.frombuffer(self._map, dtype=torch.uint8)

    def export(self) -> int:
        """Seal and hand over the fd; every tensor from ``as_tensor`` must be gone."""
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                raise PoolError("a tensor view of the pool is still alive; drop it before export") from None
            self._map = None
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a live view keeps the mapping; it goes with the view
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def create(nbytes: int, device: str = "cpu") -> Pool:
    return Pool(nbytes, device)


def check_size(fd: int, spec: PoolSpec) -> None:
    """PoolError unless the pool behind ``fd`` is ``spec``'s size (a shorter one would be read past its end)."""
    size = os.fstat(fd).st_size
    if size != spec.nbytes:
        raise PoolError(f"pool fd is {size} bytes, manifest says {spec.nbytes}")


def import_pool(fd: int, spec: PoolSpec) -> torch.Tensor:
    """Map ``fd`` (closing it) ``MAP_PRIVATE`` and return a flat uint8 tensor over the pool.

    Writes through the tensor stay in this process (copy-on-write).
    """
    try:
        check_size(fd, spec)
        mapping = mmap.mmap(fd, spec.nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as exc:
        raise PoolError(f"cannot map a {spec.nbytes}-byte cpu pool: {exc}") from None
    finally:
        os.close(fd)
    tensor = torch.frombuffer(mapping, dtype=torch.uint8)
    _MAPS[tensor.data_ptr()] = mapping  # the tensor's storage keeps the mmap alive
    return tensor


def available_bytes(device: str = "cpu") -> int:
    """MemAvailable from /proc/meminfo: what a copy attach may use without swapping."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@functools.cache
def _libc_mmap() -> Any:
    fn = ctypes.CDLL(None, use_errno=True).mmap
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return fn


def _map_fixed(address: int, nbytes: int, prot: int, flags: int, fd: int) -> None:
    got = _libc_mmap()(address, nbytes, prot, flags | 0x10, fd, 0)  # MAP_FIXED
    if got != address:
        err = ctypes.get_errno()
        raise PoolError(f"cannot map {nbytes} bytes at {address:#x} again: {os.strerror(err)}")


def is_mapped_here(address: int) -> bool:
    """Whether a pool ``import_pool`` mapped at ``address`` still has views in this process."""
    return address in _MAPS


def view_at(address: int, spec: PoolSpec) -> torch.Tensor:
    """A flat tensor over the pool mapped at ``address``."""
    return torch.frombuffer(_MAPS[address], dtype=torch.uint8)


def unmap(address: int, spec: PoolSpec) -> None:
    """Let go of the pages of the pool mapped at ``address``, keeping its address range."""
    _map_fixed(address, spec.nbytes, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, -1)  # PROT_NONE, NORESERVE


def fill_at(address: int, spec: PoolSpec, fill: Callable[[torch.Tensor], None]) -> int:
    """A new pool of ``spec`` mapped at ``address`` (a pool unmapped there), filled by ``fill`` (a flat uint8
    tensor over it), sealed and mapped as ``import_pool`` maps it: its fd, to publish. On an error nothing
    stays mapped there."""
    pool = Pool(spec.nbytes)
    try:
        _map_fixed(address, spec.nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, pool.fd)
        fill(view_at(address, spec))
        _map_fixed(address, spec.nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, pool.fd)
        return pool.export()  # sealed: no writable shared mapping of it is left
    except BaseException:
        unmap(address, spec)
        pool.close()
        raise


def remap(address: int, fd: int, spec: PoolSpec) -> None:
    """Map ``fd`` (closing it) at ``address`` again, as ``import_pool`` maps it."""
    try:
        check_size(fd, spec)
        _map_fixed(address, spec.nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd)
    finally:
        os.close(fd)
