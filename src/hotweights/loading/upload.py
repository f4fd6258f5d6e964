"""Host memory -> GPU at the link's speed: the upload behind a wake from a host copy (``resident.map_again``).

A pageable ``copy_`` goes at a fraction of the link's speed, and one thread's ``memcpy`` (page faults on a
fresh mapping included) is the limit of one staging pair, so ``upload`` splits the range over up to
``THREADS`` workers, each with two pinned staging buffers and its own stream: it copies pageable memory into
one buffer (``memmove``, which lets go of the GIL) while the GPU reads the other
(``benchmarks/host_upload.py`` measures the variants). Pinning the buffers is the slow part of a first
upload (seconds for 2 GiB); ``warm_stages`` does it ahead, off the wake's path (a deep park calls it), and
torch's pinned-memory cache keeps them for every later upload of the process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

STAGE_BYTES = 64 << 20
THREADS = max(1, min(16, os.cpu_count() or 1))
_WARMING: list[threading.Thread] = []


def upload(host: torch.Tensor, dst: torch.Tensor, threads: int = THREADS) -> None:
    """``dst.copy_(host)``; to a GPU by ``threads`` workers over contiguous slices."""
    if not dst.is_cuda or host.numel() <= STAGE_BYTES:
        dst.copy_(host)
        return
    for warming in _WARMING:
        warming.join()  # its stages are the ones this upload takes from torch's cache
    chunks = -(-host.numel() // STAGE_BYTES)
    threads = max(1, min(threads, chunks))
    per = -(-chunks // threads) * STAGE_BYTES
    ranges = [(at, min(at + per, host.numel())) for at in range(0, host.numel(), per)]
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="hotweights-upload") as pool:
        for done in [pool.submit(_upload_range, host, dst, lo, hi) for lo, hi in ranges]:
            done.result()


def _upload_range(host: torch.Tensor, dst: torch.Tensor, lo: int, hi: int) -> None:
    import torch

    torch.cuda.set_device(dst.device)
    stream = torch.cuda.Stream(dst.device)
    stages = [torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    done = [torch.cuda.Event(), torch.cuda.Event()]
    src = host.data_ptr()
    for i, at in enumerate(range(lo, hi, STAGE_BYTES)):
        n = min(STAGE_BYTES, hi - at)
        stage, event = stages[i % 2], done[i % 2]
        event.synchronize()  # the GPU has read this stage's previous chunk
        ctypes.memmove(stage.data_ptr(), src + at, n)
        with torch.cuda.stream(stream):
            dst[at: at + n].copy_(stage[:n], non_blocking=True)
            event.record(stream)
    stream.synchronize()


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
