"""Parallel block reader: checkpoint file -> staging buffers -> pools, hashing on the way.

A shard is read in fixed ``BLOCK_BYTES`` blocks by a few threads with ``preadv``
(the GIL is released for the read and for xxh3), straight into a ring of staging
buffers: pinned host memory when the pools live on a GPU. The main thread walks the
blocks in order and copies each tensor's bytes to its pool slot; GPU uploads are
asynchronous on one stream, so the disk, the CPU and the copy engine all work at once.

A dtype cast happens on the destination device. A block boundary can split one
element of a cast tensor: those few bytes are carried over and the element is cast
on its own.

Not covered: O_DIRECT reads (the page cache is used, and left warm).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import torch

from ..pools import torch_dtype
from .digest import BLOCK_BYTES, block_digest, combine

NUM_SLOTS = 6
NUM_THREADS = 4


class Segment(NamedTuple):
    """One tensor's byte range ``[begin, end)`` that a block holds, at ``at`` in the block."""

    name: str
    src_dtype: torch.dtype
    dst: torch.Tensor  # the tensor's flat destination
    begin: int
    end: int
    at: int
    nbytes: int  # the whole tensor's


class Staging:
    """Ring of block-sized buffers, plus the GPU stream and scratch when the target is a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.slots = [torch.empty(BLOCK_BYTES, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(NUM_SLOTS)]
        self.events = [torch.cuda.Event() for _ in range(NUM_SLOTS)] if self.cuda else []
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.scratch = torch.empty(BLOCK_BYTES + 16, dtype=torch.uint8, device=device) if self.cuda else None
        self.readers = ThreadPoolExecutor(NUM_THREADS, thread_name_prefix="hotweights-read")

    def close(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        self.readers.shutdown(wait=True)

    def _read(self, fd: int, offset: int, n: int, slot: int) -> bytes:
        if self.cuda:
            self.events[slot].synchronize()  # the copy engine is done with this buffer
        view = memoryview(self.slots[slot].numpy())[:n]
        got = 0
        while got < n:
            step = os.preadv(fd, [view[got:]], offset + got)
            if step == 0:
                raise OSError(f"unexpected end of file at byte {offset + got}")
            got += step
        return block_digest(view)

    def fill(self, path, size: int, segments: list[list[Segment]], progress: Callable[[int], None]) -> str:
        """Read ``path`` block by block; ``segments[k]`` lists what block k feeds. Returns the digest."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        pending: deque[Future] = deque()
        try:
            num_blocks = -(-size // BLOCK_BYTES)
            for k in range(min(NUM_SLOTS, num_blocks)):
                pending.append(self.readers.submit(self._read, fd, k * BLOCK_BYTES,
                                                min(BLOCK_BYTES, size - k * BLOCK_BYTES), k % NUM_SLOTS))
            digests, carry = [], {}
            for k in range(num_blocks):
                digests.append(pending.popleft().result())
                slot = k % NUM_SLOTS
                buf = self.slots[slot]
                for seg in segments[k]:
                    self._copy(buf, seg, carry)
                if self.cuda:
                    self.events[slot].record(self.stream)
                nxt = k + NUM_SLOTS
                if nxt < num_blocks:
                    pending.append(self.readers.submit(self._read, fd, nxt * BLOCK_BYTES,
                                                    min(BLOCK_BYTES, size - nxt * BLOCK_BYTES), slot))
                progress(min(size, (k + 1) * BLOCK_BYTES))
            return combine(digests)
        finally:
            for f in pending:  # on error: stop queued reads, wait for running ones, then close
                f.cancel()
            for f in pending:
                if not f.cancelled():
                    f.exception()
            os.close(fd)

    def _copy(self, buf: torch.Tensor, seg: Segment, carry: dict) -> None:
        """One segment, found at ``buf[seg.at:]``, into its destination (cast if its dtype differs)."""
        name, src_dtype, dst, a, b, x, total = seg
        raw = buf[x:x + b - a]
        if dst.dtype == src_dtype:
            dst_raw = dst.view(torch.uint8)[a:b]
            if self.cuda:
                with torch.cuda.stream(self.stream):
                    dst_raw.copy_(raw, non_blocking=True)
            else:
                dst_raw.copy_(raw)
            return
        isz = torch.empty(0, dtype=src_dtype).element_size()
        first, last = -(-a // isz), b // isz  # whole elements inside [a, b)
        if a % isz:  # finish the element split by the previous block boundary
            head = carry.pop(name) + bytes(raw[: first * isz - a].numpy())
            value = torch.frombuffer(bytearray(head), dtype=src_dtype)
            with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                dst[first - 1:first].copy_(value.to(dst.dtype), non_blocking=self.cuda)
        if b % isz and b < total:
            carry[name] = bytes(raw[last * isz - a:].numpy())
        if last <= first:
            return
        body = raw[first * isz - a: last * isz - a]
        if self.cuda:
            with torch.cuda.stream(self.stream):
                stage = self.scratch[:body.numel()]
                stage.copy_(body, non_blocking=True)
                dst[first:last].copy_(stage.view(src_dtype))
        else:
            if body.storage_offset() % isz:
                body = body.clone()
            dst[first:last].copy_(body.view(src_dtype))


def plan_segments(tensors, dest: Callable[[str], torch.Tensor], size: int) -> list[list[Segment]]:
    """For each block of a file, the tensor byte ranges it holds and where they go."""
    blocks: list[list[Segment]] = [[] for _ in range(-(-size // BLOCK_BYTES))]
    for t in tensors:
        if t.end == t.begin:
            continue
        dst = dest(t.name).view(-1)
        src_dtype = torch_dtype(t.dtype)
        pos = t.begin
        while pos < t.end:
            k = pos // BLOCK_BYTES
            stop = min(t.end, (k + 1) * BLOCK_BYTES)
            blocks[k].append(Segment(t.name, src_dtype, dst, pos - t.begin, stop - t.begin, pos - k * BLOCK_BYTES,
                                     t.end - t.begin))
            pos = stop
    return blocks
