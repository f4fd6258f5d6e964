"""CUDA pools: VMM allocations (``cuMemCreate``) shared as POSIX file descriptors.

Uses NVIDIA's official Python bindings (``cuda.bindings.driver``); every driver call
goes through ``_check``, which names the call. The allocation is created with
``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``, exported once, and the fd is what the
daemon keeps. Physical memory lives while any process holds an fd or a mapping, so a
fresh process can import it after the loader (and even the daemon) died.

Importer: ``cuMemImportFromShareableHandle`` -> reserve VA -> map -> set access. In
zero-copy mode the access is ``PROT_READ``: a kernel that writes a weight faults with
``cudaErrorIllegalAddress``, which ends that engine's CUDA context (other engines and
the cached bytes are untouched). The allocation handle is released right after
mapping and the fd closed right after import; the mapping alone holds the memory and
is unmapped when the last tensor view over it dies (``_Mapping.__del__``).

A deep park (``unmap``/``remap``) keeps the VA reservation of a mapping: ``unmap`` unmaps the range (the
engine's hold on the physical memory goes), ``remap`` imports a pool fd and maps it at the same address,
so every tensor view and every CUDA graph that captured a pointer into it is valid again.

Not covered: multi-GPU pools (one pool lives on one GPU), fabric/NVLink handles.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..errors import PoolError
from ..manifest import PoolSpec

logger = logging.getLogger(__name__)

try:
    from cuda.bindings import driver as _drv
except ImportError:  # pragma: no cover - depends on the machine
    _drv = None

_FD = None if _drv is None else _drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def _check(result: tuple[Any, ...], name: str) -> Any:
    err = result[0]
    if err != _drv.CUresult.CUDA_SUCCESS:
        _, text = _drv.cuGetErrorName(err)
        raise PoolError(f"{name} failed: {text.decode() if isinstance(text, bytes) else text}")
    return result[1] if len(result) == 2 else result[1:]


def _require_driver() -> None:
    if _drv is None:
        raise PoolError("cuda pools need NVIDIA's cuda-bindings: pip install cuda-bindings")


@functools.cache
def _device_index(device: str) -> int:
    from .devices import index_of_uuid

    uuid = device.split(":", 1)[1]
    try:
        return index_of_uuid(uuid)
    except ValueError as exc:
        raise PoolError(str(exc)) from None


def _ensure_context(index: int) -> None:
    _ensure_context_on_thread(index, threading.get_ident())


@functools.cache
def _ensure_context_on_thread(index: int, _thread: int) -> None:
    # torch owns the primary context; make it current on this thread for driver calls
    torch.cuda.set_device(index)
    torch.cuda.init()  # type: ignore[no-untyped-call]
    torch.empty(1, device=f"cuda:{index}")
    _check(_drv.cuInit(0), "cuInit")
    ctx = _check(_drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if not int(ctx):
        dev = _check(_drv.cuDeviceGet(index), "cuDeviceGet")
        ctx = _check(_drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(_drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def _prop(index: int) -> Any:
    prop = _drv.CUmemAllocationProp()
    prop.type = _drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = _drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = index
    prop.requestedHandleTypes = _FD
    return prop


@functools.cache
def granularity(index: int) -> int:
    flag = _drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    return int(_check(_drv.cuMemGetAllocationGranularity(_prop(index), flag), "cuMemGetAllocationGranularity"))


def _access(index: int, *, read_only: bool) -> Any:
    desc = _drv.CUmemAccessDesc()
    desc.location.type = _drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = index
    desc.flags = (_drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ if read_only
                  else _drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return desc


_MAPPINGS: weakref.WeakValueDictionary[int, _Mapping] = weakref.WeakValueDictionary()  # base address -> mapping


class _Mapping:
    """A mapped VA range; exposes ``__cuda_array_interface__`` and unmaps when collected."""

    def __init__(self, handle: Any, nbytes: int, mapped_bytes: int, index: int, *, read_only: bool) -> None:
        self.index = index
        self.nbytes = nbytes
        self.mapped_bytes = mapped_bytes
        self.mapped = True
        self.ptr = 0
        ptr = int(_check(_drv.cuMemAddressReserve(mapped_bytes, 0, 0, 0), "cuMemAddressReserve"))
        try:
            _check(_drv.cuMemMap(ptr, mapped_bytes, 0, handle, 0), "cuMemMap")
        except PoolError:
            _drv.cuMemAddressFree(ptr, mapped_bytes)
            raise
        self.ptr = ptr
        _check(_drv.cuMemSetAccess(ptr, mapped_bytes, [_access(index, read_only=read_only)], 1), "cuMemSetAccess")
        # torch rejects the interface's read-only flag; the driver-level PROT_READ is what protects
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}
        _MAPPINGS[ptr] = self

    def unmap(self) -> None:
        torch.cuda.synchronize(self.index)  # nothing queued may read the range any more
        _check(_drv.cuMemUnmap(self.ptr, self.mapped_bytes), "cuMemUnmap")
        self.mapped = False

    def remap(self, handle: Any, *, read_only: bool) -> None:
        _check(_drv.cuMemMap(self.ptr, self.mapped_bytes, 0, handle, 0), "cuMemMap")
        self.mapped = True
        access = _access(self.index, read_only=read_only)
        _check(_drv.cuMemSetAccess(self.ptr, self.mapped_bytes, [access], 1), "cuMemSetAccess")

    def as_tensor(self) -> torch.Tensor:
        # torch keeps a reference to self for the tensor's lifetime (and every view's)
        return torch.as_tensor(self, device=f"cuda:{self.index}")

    def __del__(self) -> None:
        if self.ptr and _drv is not None:
            # kernels queued on any stream may still read this range: unmapping under them
            # is an illegal address, so wait for the device first (teardown only, rare)
            try:
                torch.cuda.synchronize(self.index)
            except Exception:  # interpreter shutdown or a dead context: unmap anyway
                pass
            if self.mapped:
                _drv.cuMemUnmap(self.ptr, self.mapped_bytes)
            _drv.cuMemAddressFree(self.ptr, self.mapped_bytes)
            self.ptr = 0


class Pool:
    """Loader side: a fresh VMM allocation mapped read-write, exportable as an fd."""

    def __init__(self, nbytes: int, device: str) -> None:
        _require_driver()
        self.nbytes = nbytes
        self.device = device
        self.index = _device_index(device)
        _ensure_context(self.index)
        gran = granularity(self.index)
        size = -(-nbytes // gran) * gran
        handle = _check(_drv.cuMemCreate(size, _prop(self.index), 0), "cuMemCreate")
        try:
            self.fd = int(_check(_drv.cuMemExportToShareableHandle(handle, _FD, 0), "cuMemExportToShareableHandle"))
            self._mapping: _Mapping | None = _Mapping(handle, nbytes, size, self.index, read_only=False)
        finally:
            _check(_drv.cuMemRelease(handle), "cuMemRelease")  # the fd and the mapping hold the memory

    def as_tensor(self) -> torch.Tensor:
        if self._mapping is None:
            raise PoolError("pool was already exported")
        return self._mapping.as_tensor()

    def export(self) -> int:
        """Hand over the fd. The loader's own mapping goes with the last tensor over it."""
        torch.cuda.synchronize(self.index)
        self._mapping = None
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        self._mapping = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def create(nbytes: int, device: str) -> Pool:
    return Pool(nbytes, device)


def import_pool(fd: int, spec: PoolSpec) -> torch.Tensor:
    """Import ``fd`` (closing it) and map it read-only; a flat uint8 tensor over the pool."""
    try:
        _require_driver()
        index = _device_index(spec.device)
        _ensure_context(index)
        handle = _check(_drv.cuMemImportFromShareableHandle(fd, _FD), "cuMemImportFromShareableHandle")
    finally:
        os.close(fd)
    try:
        gran = granularity(index)
        mapping = _Mapping(handle, spec.nbytes, -(-spec.nbytes // gran) * gran, index, read_only=True)
    finally:
        _check(_drv.cuMemRelease(handle), "cuMemRelease")
    return mapping.as_tensor()


def is_mapped_here(address: int) -> bool:
    """Whether a pool ``import_pool`` mapped at ``address`` still has views in this process."""
    return address in _MAPPINGS


def _mapping_at(address: int) -> _Mapping:
    mapping = _MAPPINGS.get(address)
    if mapping is None:
        raise PoolError(f"no pool mapping at {address:#x} in this process")
    return mapping


def view_at(address: int, spec: PoolSpec) -> torch.Tensor:
    """A flat tensor over the pool mapped at ``address``."""
    return _mapping_at(address).as_tensor()


def unmap(address: int, spec: PoolSpec) -> None:
    """Unmap the pool mapped at ``address``, keeping its VA reservation."""
    _mapping_at(address).unmap()


def remap(address: int, fd: int, spec: PoolSpec) -> None:
    """Import ``fd`` (closing it) and map it read-only at ``address`` again."""
    mapping = _mapping_at(address)
    try:
        os.fstat(fd)
    except OSError:
        raise PoolError(f"pool fd {fd} is not open") from None
    try:
        handle = _check(_drv.cuMemImportFromShareableHandle(fd, _FD), "cuMemImportFromShareableHandle")
    finally:
        os.close(fd)
    try:
        mapping.remap(handle, read_only=True)
    finally:
        _check(_drv.cuMemRelease(handle), "cuMemRelease")


def fill_at(address: int, spec: PoolSpec, fill: Callable[[torch.Tensor], None], *, wait: bool = True) -> int:
    """A new allocation of ``spec`` mapped read-write at ``address`` (a pool unmapped there), filled by
    ``fill`` (a flat uint8 tensor over it), then made read-only: its fd, to publish. Filling in place spares
    a second 16 GiB mapping and its teardown; on an error nothing stays mapped there. ``wait=False``: ``fill``
    only queues its copies, and the caller makes the pool read-only once they ran (``seal_at``), so that the
    copies into many pools run back to back, not each behind the next pool's allocation and a wait."""
    mapping = _mapping_at(address)
    handle = _check(_drv.cuMemCreate(mapping.mapped_bytes, _prop(mapping.index), 0), "cuMemCreate")
    fd = -1
    try:
        fd = int(_check(_drv.cuMemExportToShareableHandle(handle, _FD, 0), "cuMemExportToShareableHandle"))
        mapping.remap(handle, read_only=False)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        _check(_drv.cuMemRelease(handle), "cuMemRelease")  # the fd and the mapping hold the memory
    try:
        fill(mapping.as_tensor())
        if wait:
            seal_at(address, spec)
    except BaseException:
        mapping.unmap()
        os.close(fd)
        raise
    return fd


def seal_at(address: int, spec: PoolSpec) -> None:
    """The pool ``fill_at`` filled at ``address`` made read-only, once what is queued on its GPU has run."""
    mapping = _mapping_at(address)
    torch.cuda.synchronize(mapping.index)
    access = _access(mapping.index, read_only=True)
    _check(_drv.cuMemSetAccess(mapping.ptr, mapping.mapped_bytes, [access], 1), "cuMemSetAccess")


def available_bytes(device: str) -> int:
    """Free bytes on the GPU of ``device`` (``cuda:<uuid>``), as the driver reports them."""
    free, _total = torch.cuda.mem_get_info(_device_index(device))
    return int(free)
