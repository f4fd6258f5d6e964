"""What a pool fd must be, checked without a CUDA context (the daemon has none).

- ``cpu``: a regular file (a memfd) of exactly the pool's size, sealed against write,
  shrink and grow.
- ``cuda:<uuid>``: an fd exported by the CUDA driver (``cuMemExportToShareableHandle``),
  which the kernel shows as a character device of the NVIDIA driver or an anonymous
  inode it names; pipes, sockets, regular files (memfds included), ``/dev/null`` and
  other anonymous inodes (eventfd, timerfd, ...) are refused. Its size is known only
  to the driver: the engine's import and map check it.

Stdlib only: the daemon checks publishes with it, and engines check attach replies.
"""

from __future__ import annotations

import fcntl
import functools
import os
import stat

from ..manifest import PoolSpec

_REQUIRED_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def fd_kind(fd: int) -> str:
    """What the kernel says ``fd`` is: a path, ``pipe:[..]``, ``anon_inode:[eventfd]``, ..."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "unknown"


@functools.cache
def _nvidia_majors() -> frozenset[int]:
    try:
        lines = open("/proc/devices").read().splitlines()
    except OSError:
        return frozenset()
    return frozenset(int(parts[0]) for line in lines if len(parts := line.split()) == 2 and parts[0].isdigit()
                     and "nvidia" in parts[1])


def pool_fd_problem(fd: int, pool: PoolSpec) -> str:
    """Why ``fd`` cannot back ``pool``, or '' if it can."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        return f"fd {fd} cannot be inspected: {exc.strerror}"
    if pool.device == "cpu":
        if not stat.S_ISREG(st.st_mode) or st.st_size != pool.nbytes:
            return f"fd is not a memfd of {pool.nbytes} bytes ({fd_kind(fd)}, size {st.st_size})"
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if seals & _REQUIRED_SEALS != _REQUIRED_SEALS:
            return f"memfd is not sealed against write/shrink/grow (seals {seals:#x})"
        return ""
    if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in _nvidia_majors():
        return ""  # the common case (/dev/nvidiactl) costs one fstat: this runs on every attach
    kind = fd_kind(fd)
    if stat.S_IFMT(st.st_mode) == 0 and kind.startswith("anon_inode:") and "nvidia" in kind.lower():
        return ""
    return f"fd is {kind}, not a CUDA allocation exported by the NVIDIA driver"


def pool_fds_problem(pools: tuple[PoolSpec, ...] | list[PoolSpec], fds: list[int]) -> str:
    """Why ``fds`` cannot back ``pools`` (one fd per pool, in order), or '' if they can."""
    if len(fds) != len(pools):
        return f"manifest names {len(pools)} pools but {len(fds)} fds came with it"
    for i, (fd, pool) in enumerate(zip(fds, pools)):
        if problem := pool_fd_problem(fd, pool):
            return f"pool {i}: {problem}"
    return ""


def host_pools(pools: tuple[PoolSpec, ...] | list[PoolSpec]) -> tuple[PoolSpec, ...]:
    """What a host copy's fds must be: a sealed memfd of each pool's size, whatever device the pool is on."""
    return tuple(PoolSpec(p.nbytes, "cpu") for p in pools)
