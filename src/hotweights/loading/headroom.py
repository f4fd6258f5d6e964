"""Will a preload fit? Checked before a byte is read, so that a cache too large for the machine is
one line, not the OOM killer taking a process (perhaps the daemon, and every entry with it).

Host pools are memfd pages (shared memory): what they may use is the smaller of the kernel's
``MemAvailable`` and the headroom of this process's memory cgroup (v2 ``memory.max`` minus the
working set ``memory.current - inactive_file``; v1 ``memory.limit_in_bytes`` minus
``memory.usage_in_bytes - total_inactive_file``). GPU pools need that much free device memory.

Stdlib only, but for the GPU's free memory (torch, which a preload has imported already).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import HotweightsError
from ..evidence import size_text
from ..manifest import DTYPE_ITEMSIZE
from .checkpoint import Checkpoint, target_dtype

GIB = 1 << 30
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as about 2**63


class WontFit(HotweightsError):
    """A preload that the memory it would go to cannot hold."""


def needed_bytes(ckpt: Checkpoint, dtype: str) -> int:
    """The pools' bytes for ``ckpt`` cast to ``dtype`` (floating tensors take it, the rest stay as stored)."""
    quantized = ckpt.quantization[0] != "none"
    total = 0
    for shard in ckpt.shards:
        for t in shard.tensors:
            stored = DTYPE_ITEMSIZE[t.dtype]
            total += (t.end - t.begin) // stored * DTYPE_ITEMSIZE[target_dtype(t.dtype, dtype, quantized)]
    return total


def host_headroom(proc: Path = Path("/proc"), sysfs: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """Bytes of host memory a preload may take, and where that bound comes from."""
    meminfo = dict(line.split(":", 1) for line in (proc / "meminfo").read_text().splitlines() if ":" in line)
    available = int(meminfo["MemAvailable"].split()[0]) * 1024
    bound = (available, f"MemAvailable {available / GIB:.2f} GiB")
    cgroup = _cgroup_headroom((proc / "self" / "cgroup").read_text(), sysfs)
    return cgroup if cgroup and cgroup[0] < available else bound


def _cgroup_headroom(self_cgroup: str, sysfs: Path) -> tuple[int, str] | None:
    for line in self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            files = ("memory.max", "memory.current", "inactive_file")
            root = sysfs
        elif "memory" in controllers.split(","):  # v1
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            root = sysfs / "memory"
        else:
            continue
        directory = _visible(root, path, files[0])
        if directory is None:
            continue
        limit_text = (directory / files[0]).read_text().strip()
        limit = UNLIMITED if limit_text == "max" else int(limit_text)
        if limit >= UNLIMITED:
            continue
        usage = int((directory / files[1]).read_text())
        stat = dict(row.split() for row in (directory / "memory.stat").read_text().splitlines() if row.strip())
        working = usage - int(stat.get(files[2], 0))
        return max(0, limit - working), (f"cgroup {path or '/'}: limit {limit / GIB:.2f} GiB, "
                                         f"{working / GIB:.2f} GiB in use")
    return None


def _visible(root: Path, path: str, probe: str) -> Path | None:
    """The cgroup's directory as this mount shows it: a container sees its own cgroup as the root,
    so leading components of ``path`` may be missing from the mount."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) + 1):
        candidate = root.joinpath(*parts[i:])
        if (candidate / probe).is_file():
            return candidate
    return None


def gpu_free(index: int) -> int:
    import torch

    free, _total = torch.cuda.mem_get_info(index)
    return int(free)


def check_fits(ckpt: Checkpoint, dtype: str, device: str, index: int | None) -> None:
    """Raise WontFit, in one line naming the sizes and what to do, when the pools cannot fit."""
    need = needed_bytes(ckpt, dtype)
    if device == "cpu":
        room, source = host_headroom()
        where = "host memory"
    else:
        room, source = gpu_free(index or 0), f"free on cuda:{index or 0}"
        where = "GPU memory"
    if need > room:
        raise WontFit(f"{ckpt.directory.name} as {dtype} needs {need / GIB:.2f} GiB of {where}; only "
                      f"{room / GIB:.2f} GiB can be had ({source}): nothing was read or cached. Free memory, "
                      f"release entries (hotweights release KEY), or preload another dtype or device")


def check_budget(ckpt: Checkpoint, dtype: str, max_bytes: int, in_use: int) -> None:
    """Raise WontFit, before a byte is read, when the daemon's budget (``--max-bytes``) cannot take the pools
    (the daemon checks it again, exactly, on publish)."""
    need = needed_bytes(ckpt, dtype)
    if max_bytes and in_use + need > max_bytes:
        raise WontFit(f"{ckpt.directory.name} as {dtype} needs {size_text(need)}, which would exceed the daemon budget "
                      f"of {size_text(max_bytes)} ({size_text(in_use)} in use): nothing was read or cached. Release an "
                      f"entry (hotweights release KEY) or raise --max-bytes")


def lower_priority_for_the_oom_killer(score: int = 500) -> None:
    """Make this process (a loader) the OOM killer's first choice over the keeper and the engines: a loader
    that dies loses only its own work; the daemon's death loses every entry. Raising one's own
    ``oom_score_adj`` needs no privilege."""
    try:
        Path("/proc/self/oom_score_adj").write_text(str(score))
    except OSError:
        pass
