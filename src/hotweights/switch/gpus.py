"""GPU memory as the switch reads it: ``nvidia-smi`` (through ``smi.py``; nothing where there is none), per GPU the
front sees (numbered as CUDA numbers them under the front's ``CUDA_VISIBLE_DEVICES``), and per process. Torch-free:
the front holds no CUDA context."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..smi import smi_rows
from ..unix import proc_status


@dataclass(frozen=True, slots=True)
class GpuMemory:
    total_mib: int
    free_mib: int


def gpu_mib_by_pid() -> dict[int, int]:
    """GPU memory per process, {} where there is none."""
    try:
        return {int(p): int(m) for p, m in smi_rows("--query-compute-apps=pid,used_memory")}
    except ValueError:
        return {}


def host_mib(pids: list[int]) -> int | None:
    """The host memory these processes hold of their own (``VmRSS`` less ``RssShmem``: the keeper's shared pages they
    map, a host copy pinned for a wake among them, are the keeper's, counted there), None where none can be read."""
    read = [status["VmRSS"] - status.get("RssShmem", 0) for pid in pids if "VmRSS" in (status := proc_status(pid))]
    return sum(read) >> 20 if read else None


def gpu_memory(visible: str | None = None) -> dict[int, GpuMemory]:
    """Total and free memory of each GPU the front sees, by its CUDA index: ``visible`` (default: the front's
    ``CUDA_VISIBLE_DEVICES``) lists physical indices or UUIDs (or their prefixes), as CUDA reads it; {} without
    nvidia-smi."""
    rows = smi_rows("--query-gpu=index,uuid,memory.total,memory.free")
    try:
        physical = [(int(i), uuid, GpuMemory(int(total), int(free))) for i, uuid, total, free in rows]
    except ValueError:
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None:
        return {i: mem for i, _, mem in physical}
    out: dict[int, GpuMemory] = {}
    for entry in (x.strip() for x in visible.split(",")):
        found = next((mem for i, uuid, mem in physical if entry == str(i) or (entry and uuid.startswith(entry))), None)
        if found is None:  # CUDA stops at the first entry it cannot use
            break
        out[len(out)] = found
    return out
