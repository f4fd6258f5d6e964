"""Memory samples for verify: what the cache holds and what the engine adds.

CPU: bytes in the daemon's pools (from ``status``) plus the resident memory of the
daemon and the engine from ``/proc/<pid>/status`` (``RssAnon`` is private memory;
zero-copy weights show up as ``RssShmem``, shared with the daemon's pools).
GPU: used memory per GPU this run may use, from ``nvidia-smi`` (all processes, as a user sees it).
``page_cache_resident``: how much of the checkpoint the page cache holds before a start.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

from ..unix import proc_status
from .environment import nvidia_smi

__all__ = ["proc_status"]  # read here by benchmarks/switch_trace.py too


def sample(device: str, *, socket_dir: Path, engine_pids: list[int] | None = None) -> dict:
    """Memory now: the keeper's pools and RSS, the engine's processes (``engine_pids``), the GPU's use."""
    status = subprocess.run([sys.executable, "-m", "hotweights", "status", "--json", "--socket-dir", str(socket_dir)],
                            capture_output=True, text=True)
    daemon = json.loads(status.stdout) if status.returncode == 0 else None
    result: dict = {"daemon_running": daemon is not None,
                    "pool_bytes": sum(daemon["bytes_by_device"].values()) if daemon else 0,
                    "daemon_rss": proc_status(daemon["pid"]).get("VmRSS", 0) if daemon else 0}
    if engine_pids is not None:
        engine = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "RssShmem": 0}
        for pid in engine_pids:
            for k, v in proc_status(pid).items():
                engine[k] += v
        result["engine"] = engine
    if device.startswith("cuda"):
        result["gpu_used_mib"] = {row[0]: int(row[1]) for row in
                                  nvidia_smi("index,memory.used", "csv,noheader,nounits") if len(row) == 2}
    result["total_bytes"] = (result["pool_bytes"] + result["daemon_rss"]
                             + result.get("engine", {}).get("RssAnon", 0))
    return result


def pool_mappings(pid: int) -> int:
    """Mappings of the keeper's CPU pools (memfds) in ``pid``, -1 if unreadable (GPU pools do not show there)."""
    try:
        return sum("memfd:hotweights-pool" in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    except OSError:
        return -1


def page_cache_resident(model_dir: str | os.PathLike[str]) -> float | None:
    """Fraction (0..1) of the checkpoint's ``*.safetensors`` bytes in the page cache now (mincore),
    None where it cannot be read. States which page-cache state a disk start ran with."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = os.sysconf("SC_PAGE_SIZE")
    total = resident = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        size = path.stat().st_size
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = (size + page - 1) // page
                vec = ctypes.create_string_buffer(pages)
                if libc.mincore(addr, size, vec) != 0:
                    return None
                resident += sum(b & 1 for b in vec.raw) * page
                total += pages * page
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else None


def evict_page_cache(model_dir: str | os.PathLike[str]) -> None:
    """Drop the checkpoint's ``*.safetensors`` from the page cache (a node whose cache was reclaimed):
    written back first, since the kernel keeps dirty pages; the next read comes from the drive."""
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
