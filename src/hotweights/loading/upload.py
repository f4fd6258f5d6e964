"""Host memory -> GPU at the link's speed: the upload behind a wake from a host copy (``resident.map_again``).

A pageable ``copy_`` goes at a fraction of the link's speed, and one thread's copy is the limit of one staging
pair, so ``upload`` splits the range over up to ``THREADS`` workers, each with two pinned staging buffers and
its own stream: it fills one buffer while the GPU reads the other. The source is the host copy's fd (the
wake's: ``preadv`` straight into the stage, the kernel copying from the memfd's pages: no mapping of 16 GiB,
so no page faults and no ``munmap`` after it) or a host tensor (``memmove``; both let go of the GIL;
``benchmarks/host_upload.py`` measures the variants side by side). Pinning the buffers is the slow part of a first
upload (seconds for 2 GiB); ``warm_stages`` does it ahead, off the wake's path (a deep park calls it), and
torch's pinned-memory cache keeps them for every later upload of the process.

Faster still where there is time ahead (a deep park): ``Pinned`` maps the host copy's memfd shared and read-only
and registers it with CUDA, so the wake is one DMA from the keeper's own pages at the link's speed: 16 GiB in
0.35 s on an H200 (49 GB/s) against 0.50-0.52 s through the stages (34 GB/s), and ~1 s to register it ahead
(``benchmarks/results/gpu_headline/host_upload_shared_ro_16g.json``). A private mapping registered takes 7 s and a
private copy of every page (``host_upload_ahead_16g.json``): never that.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

STAGE_BYTES = 64 << 20
THREADS = max(1, min(16, os.cpu_count() or 1))
_WARMING: list[threading.Thread] = []


def upload(src: torch.Tensor | int, dst: torch.Tensor, threads: int = THREADS) -> None:
    """``dst`` (a flat uint8 tensor) filled with the bytes of ``src``: a host tensor of its size, or a file
    descriptor (read from offset 0; the caller keeps it); to a GPU by ``threads`` workers over contiguous
    slices. OSError when the fd holds fewer bytes."""
    nbytes = dst.numel()
    if not dst.is_cuda or nbytes <= STAGE_BYTES:
        if isinstance(src, int) and dst.is_cpu:
            _read_exactly(src, _view(dst.data_ptr(), nbytes), 0)
        else:
            dst.copy_(_read_all(src, nbytes) if isinstance(src, int) else src)
        return
    for warming in _WARMING:
        warming.join()  # its stages are the ones this upload takes from torch's cache
    chunks = -(-nbytes // STAGE_BYTES)
    threads = max(1, min(threads, chunks))
    per = -(-chunks // threads) * STAGE_BYTES
    ranges = [(at, min(at + per, nbytes)) for at in range(0, nbytes, per)]
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="hotweights-upload") as pool:
        for done in [pool.submit(_upload_range, src, dst, lo, hi) for lo, hi in ranges]:
            done.result()


PORTABLE = 0x01  # cudaHostRegisterPortable


def download(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst`` (host memory, a shared memfd's mapping) filled from ``src`` (a CUDA tensor of as many bytes) in one DMA:
    ``dst`` registered with CUDA for the copy (its pages made, and pinned, at once) and let go after it. A pageable
    ``copy_`` stages every byte through CUDA's own buffer and faults each new page in on the way: the host copy of
    an 8B took 18.0-20.7 s (H200, ten 8B, demote's process included), at a fraction of the link's speed. Where
    ``dst`` cannot be registered, that copy still."""
    import torch

    nbytes = dst.numel() * dst.element_size()
    err = torch.cuda.cudart().cudaHostRegister(dst.data_ptr(), nbytes, PORTABLE)
    if int(err) != 0:
        logger.warning("cudaHostRegister of %d bytes of host memory failed (%s): a pageable copy", nbytes, err)
        dst.copy_(src)
        return
    try:
        with torch.cuda.device(src.device):
            dst.copy_(src, non_blocking=True)
            torch.cuda.current_stream().synchronize()
    finally:
        torch.cuda.cudart().cudaHostUnregister(dst.data_ptr())


class Pinned:
    """``nbytes`` of a host copy's fd mapped ``MAP_SHARED`` read-only and registered with CUDA (read-only, portable):
    a copy from it runs at the link's speed, and its pages stay the keeper's (``RssShmem``, sealed: no byte of the
    engine's own). OSError where it cannot be registered (the caller uploads through the stages instead)."""

    READ_ONLY_PORTABLE = 0x08 | PORTABLE  # cudaHostRegisterReadOnly | cudaHostRegisterPortable

    def __init__(self, fd: int, nbytes: int) -> None:
        import torch

        self.nbytes = nbytes
        self.identity = identity(fd)
        self._map = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not writable": it is only read
            self.host: torch.Tensor | None = torch.frombuffer(self._map, dtype=torch.uint8)
        err = torch.cuda.cudart().cudaHostRegister(self.host.data_ptr(), nbytes, self.READ_ONLY_PORTABLE)
        if int(err) != 0:
            self.host = None
            self._map.close()
            raise OSError(f"cudaHostRegister (read-only) of the host copy failed: {err}")

    def copy_to(self, dst: torch.Tensor, wait: bool = True) -> None:
        """``dst`` (a flat uint8 CUDA tensor of ``nbytes``) filled, in one DMA (``wait=False``: queued on the
        device's current stream, for the caller to wait on)."""
        import torch

        assert self.host is not None and dst.numel() == self.nbytes, "a closed or another-sized host copy"
        with torch.cuda.device(dst.device):
            dst.copy_(self.host, non_blocking=True)
            if wait:
                torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        import torch

        if self.host is None:
            return
        torch.cuda.cudart().cudaHostUnregister(self.host.data_ptr())
        self.host = None
        try:
            self._map.close()
        except BufferError:  # a view of it still lives: the mapping goes with it
            pass


def identity(fd: int) -> tuple[int, int]:
    """Which file ``fd`` is (device and inode): a host copy pinned earlier is the keeper's current one only if
    the fd the keeper hands over now is the same file."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _upload_range(src: torch.Tensor | int, dst: torch.Tensor, lo: int, hi: int) -> None:
    import torch

    torch.cuda.set_device(dst.device)
    stream = torch.cuda.Stream(dst.device)
    stages = [torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    views = [_view(stage.data_ptr(), STAGE_BYTES) for stage in stages]
    done = [torch.cuda.Event(), torch.cuda.Event()]
    for i, at in enumerate(range(lo, hi, STAGE_BYTES)):
        n = min(STAGE_BYTES, hi - at)
        stage, event = stages[i % 2], done[i % 2]
        event.synchronize()  # the GPU has read this stage's previous chunk
        if isinstance(src, int):
            _read_exactly(src, views[i % 2][:n], at)
        else:
            ctypes.memmove(stage.data_ptr(), src.data_ptr() + at, n)
        with torch.cuda.stream(stream):
            dst[at: at + n].copy_(stage[:n], non_blocking=True)
            event.record(stream)
    stream.synchronize()


def _view(address: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def _read_exactly(fd: int, into: memoryview, offset: int) -> None:
    got = 0
    while got < len(into):
        n = os.preadv(fd, [into[got:]], offset + got)
        if n <= 0:
            raise OSError(f"the host copy ends at byte {offset + got}; {len(into) - got} more were expected")
        got += n


def _read_all(fd: int, nbytes: int) -> torch.Tensor:
    import torch

    out = torch.empty(nbytes, dtype=torch.uint8)
    _read_exactly(fd, _view(out.data_ptr(), nbytes), 0)
    return out


def warm_stages(index: int, threads: int = THREADS) -> None:
    """Pin every staging buffer an upload with ``threads`` workers takes, in a thread of its own (on GPU
    ``index``'s context: a thread starts on GPU 0's), and give them back to torch's pinned-memory cache (an
    ``upload`` waits for it): the next upload starts at speed."""
    if _WARMING:
        return

    def pin() -> None:
        import torch

        torch.cuda.set_device(index)
        began = time.perf_counter()
        stages = [torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2 * threads)]
        del stages
        logger.info("hotweights: %d MiB of pinned staging ready for a wake from host memory in %.2f s",
                    2 * threads * STAGE_BYTES >> 20, time.perf_counter() - began)

    _WARMING.append(threading.Thread(target=pin, name="hotweights-pin", daemon=True))
    _WARMING[0].start()
