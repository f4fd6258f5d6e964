#!/usr/bin/env python3
"""A deep-parked engine's wake from the host copy, the copy alone (GPU): host memfd -> a new CUDA pool.

What ``loading/resident.py`` does on a wake whose weights come from the keeper's host copy: map the
copy's memfd (a fresh ``MAP_PRIVATE`` mapping each round, so its page faults are counted, as in a
wake), allocate a CUDA pool, copy. Variants, interleaved, ``--repeat`` rounds each:

- ``before``: the code before this benchmark (one thread, two 256 MiB pinned stages, torch's ``copy_``
  into them);
- ``threads_N``: ``upload.upload`` from the mapping with N workers (each: two 64 MiB pinned stages,
  ``memmove``, its own stream), N in ``--threads`` (the wake's code before the preadv one);
- ``pageable``: ``dst.copy_(host)`` straight from the mapping;
- ``registered``: ``cudaHostRegister`` of the mapping (timed apart: it is paid once) and the copy after;
- ``registered_ahead`` (and ``registered_ahead_sN``: split over N streams): the mapping registered once before the
  rounds (``register_ahead_s``, with the process's VmRSS, RssShmem and VmPin before and after: what a deep park
  would pay off the wake's path and hold while parked), each round only the copy from it;
- ``pread_N`` (``--pread-threads``): the wake's code, ``upload.upload`` from the memfd itself: N workers
  ``preadv`` it straight into pinned stages, no mapping of it at all. ``--with-unmap`` counts dropping the
  host copy's mapping in every mapping variant's time, as a wake paid it (~0.28 s for 16 GiB).

Each round checks the copy (several whole 64 MiB slices at random places and the tail equal to the
host's). Prints one JSON object: medians per variant, GB/s, and every round.

Run (GPU):  python3 benchmarks/host_upload.py --gib 16 --repeat 5 --json [--pread-threads 8,16 --with-unmap]
           [--only pread_16,registered_ahead,registered_ahead_s4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

from hotweights.loading import upload
from hotweights.manifest import PoolSpec
from hotweights.pools import cpu, cuda
from hotweights.pools.devices import resolve_device


def before(host: torch.Tensor, dst: torch.Tensor) -> None:
    stage_bytes = 256 << 20
    stream = torch.cuda.Stream(dst.device)
    stages = [torch.empty(stage_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    done = [torch.cuda.Event(), torch.cuda.Event()]
    for i, at in enumerate(range(0, host.numel(), stage_bytes)):
        n = min(stage_bytes, host.numel() - at)
        stage, event = stages[i % 2], done[i % 2]
        event.synchronize()
        stage[:n].copy_(host[at: at + n])
        with torch.cuda.stream(stream):
            dst[at: at + n].copy_(stage[:n], non_blocking=True)
            event.record(stream)
    stream.synchronize()


def registered(host: torch.Tensor, dst: torch.Tensor) -> float:
    """Register, copy, unregister; the registration's seconds (the caller times the whole)."""
    cudart = torch.cuda.cudart()
    began = time.perf_counter()
    err = cudart.cudaHostRegister(host.data_ptr(), host.numel(), 0)
    register_s = time.perf_counter() - began
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    try:
        dst.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
    finally:
        cudart.cudaHostUnregister(host.data_ptr())
    return register_s


def memory_status() -> dict[str, int]:
    """This process's VmRSS, RssShmem and VmPin, in MiB."""
    with open("/proc/self/status") as f:
        rows = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(rows[k].split()[0]) >> 10 for k in ("VmRSS", "RssShmem", "VmPin") if k in rows}


def register_ahead(host: torch.Tensor) -> dict[str, object]:
    """``cudaHostRegister`` of the whole mapping, once: its seconds and the memory it moved."""
    before_ = memory_status()
    began = time.perf_counter()
    err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel(), 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    return {"register_ahead_s": round(time.perf_counter() - began, 3), "status_before_mib": before_,
            "status_after_mib": memory_status()}


def shared_readonly(fd: int, nbytes: int) -> int:
    """The memfd mapped ``MAP_SHARED``, read-only, and registered with ``cudaHostRegisterReadOnly``: pinned without a
    private copy of a page (a ``MAP_PRIVATE`` mapping pinned writable copies each one). Its address."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    address = libc.mmap(None, nbytes, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    err = torch.cuda.cudart().cudaHostRegister(address, nbytes, 8)  # cudaHostRegisterReadOnly
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister(ReadOnly) failed: {err}")
    return int(address)


def copy_from(address: int, dst: torch.Tensor) -> None:
    from cuda.bindings import runtime

    err, = runtime.cudaMemcpy(dst.data_ptr(), address, dst.numel(), runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)
    if err != runtime.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaMemcpy: {err}")


def copy_streams(host: torch.Tensor, dst: torch.Tensor, n: int) -> None:
    """One async copy per stream over ``n`` contiguous slices of a registered ``host``."""
    streams = [torch.cuda.Stream(dst.device) for _ in range(n)]
    per = -(-host.numel() // n)
    for i, stream in enumerate(streams):
        with torch.cuda.stream(stream):
            dst[i * per: (i + 1) * per].copy_(host[i * per: (i + 1) * per], non_blocking=True)
    torch.cuda.synchronize()


def same(host: torch.Tensor, dst: torch.Tensor, rng: random.Random) -> bool:
    step = 64 << 20
    starts = [rng.randrange(0, max(1, host.numel() - step)) for _ in range(4)] + [max(0, host.numel() - step)]
    return all(torch.equal(dst[a: a + step].cpu(), host[a: a + step]) for a in starts)


def copy(name: str, host: torch.Tensor, dst: torch.Tensor, fd: int, kept: torch.Tensor,
         shared: int = 0) -> dict[str, float]:
    """One round of variant ``name``: ``dst`` filled; what it measured besides its time."""
    if name == "before":
        before(host, dst)
    elif name == "pageable":
        dst.copy_(host)
        torch.cuda.synchronize()
    elif name == "registered":
        return {"register_s": round(registered(host, dst), 3)}
    elif name == "shared_ro_ahead":
        copy_from(shared, dst)
    elif name.startswith("registered_ahead"):
        copy_streams(kept, dst, int(name.partition("_s")[2] or 1))
    elif name.startswith("pread_"):
        upload.upload(fd, dst, threads=int(name.split("_")[1]))
    else:
        upload.upload(host, dst, threads=int(name.split("_")[1]))
    return {}


def main() -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=16.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", default="1,2,4,8,16")
    parser.add_argument("--pread-threads", default="", help="also the preadv variant with these worker counts")
    parser.add_argument("--with-unmap", action="store_true",
                        help="count dropping the host copy's mapping in each round, as a wake pays it")
    parser.add_argument("--only", default="", help="these variants (comma-separated), not every one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    nbytes = int(args.gib * 2**30) // (2 << 20) * (2 << 20)
    made = cpu.create(nbytes)
    view = made.as_tensor()
    base = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8)
    for i, at in enumerate(range(0, nbytes, 64 << 20)):  # random bytes, with each slice's number at its head
        n = min(64 << 20, nbytes - at)
        view[at: at + n].copy_(base[:n])
        view[at: at + 8].copy_(torch.tensor(list(i.to_bytes(8, "little")), dtype=torch.uint8))
    del view
    fd = made.export()
    variants = ["before", *[f"threads_{t}" for t in args.threads.split(",")], "pageable", "registered",
                *[f"pread_{t}" for t in args.pread_threads.split(",") if t], "registered_ahead", "registered_ahead_s4",
                "shared_ro_ahead"]
    variants = [v for v in args.only.split(",") if v] or variants
    kept = cpu.import_pool(os.dup(fd), PoolSpec(nbytes, "cpu"))  # the registered_ahead variants' one mapping
    ahead = register_ahead(kept) if any(v.startswith("registered_ahead") for v in variants) else {}
    shared = 0
    if "shared_ro_ahead" in variants:  # the same, MAP_SHARED and read-only: no private copy of each page
        began, status = time.perf_counter(), memory_status()
        shared = shared_readonly(fd, nbytes)
        ahead.update(shared_register_s=round(time.perf_counter() - began, 3), shared_status_before_mib=status,
                     shared_status_after_mib=memory_status())
    rng = random.Random(7)
    rows = []
    for r in range(args.repeat):
        for name in rng.sample(variants, len(variants)):
            host = cpu.import_pool(os.dup(fd), PoolSpec(nbytes, "cpu"))
            pool = cuda.create(nbytes, resolve_device("cuda:0").pool_device)
            dst = pool.as_tensor()
            torch.cuda.synchronize()
            began = time.perf_counter()
            extra = copy(name, host, dst, fd, kept, shared)
            seconds = time.perf_counter() - began
            if args.with_unmap:  # what a wake also pays: the host copy's mapping dropped (pread maps none)
                began = time.perf_counter()
                del host
                extra["unmap_s"] = round(time.perf_counter() - began, 3)
                if not name.startswith(("pread_", "registered_ahead", "shared_")):  # (these keep theirs)
                    seconds += extra["unmap_s"]
                host = cpu.import_pool(os.dup(fd), PoolSpec(nbytes, "cpu"))  # for the check, untimed
            rows.append({"round": r, "variant": name, "seconds": round(seconds, 3), **extra,
                         "same_bytes": same(host, dst, rng)})
            del dst, host
            pool.close()
    os.close(fd)
    if ahead:
        torch.cuda.cudart().cudaHostUnregister(kept.data_ptr())
    del kept
    medians = {}
    for name in variants:
        times = [x["seconds"] for x in rows if x["variant"] == name]
        med = statistics.median(times)
        medians[name] = {"seconds": round(med, 3), "GBps": round(nbytes / med / 1e9, 1)}
        if name == "registered":
            medians[name]["register_s"] = statistics.median(x["register_s"] for x in rows if x["variant"] == name)
    result = {"gib": round(nbytes / 2**30, 2), "repeat": args.repeat, "cpus": os.cpu_count(),
              "default_threads": upload.THREADS, "median": medians, **ahead,
              "all_same_bytes": all(x["same_bytes"] for x in rows), "rounds": rows,
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "command": "python3 benchmarks/host_upload.py " + " ".join(sys.argv[1:])}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0 if result["all_same_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main())
