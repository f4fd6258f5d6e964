#!/usr/bin/env python3
"""Where a wake from the host copy spends its time (GPU, no vLLM): ``loading/resident.map_again`` timed by part.

A daemon, ``preload --device cuda`` of MODEL, one zero-copy attach, ``resident.host_copy``; then rounds: unmap
(a deep park), release the keeper's GPU entry, ``map_again`` (from the host copy: map its memfd, a new CUDA
pool, the upload with N workers, publish, map at the same addresses). Each round prints the total and the
seconds of each timed part (``import_pool``, ``fill_at`` (a new allocation at the same addresses, the
upload inside it), ``upload``, ``publish``, ``attach_rpc``, ``_from_entry``); the last round also runs
under cProfile (its top 15 by own time to stderr); the last line is every round as one JSON list.

Run (GPU):  python3 benchmarks/host_wake_profile.py MODEL [--threads 16,16,16,16,8,8]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from hotweights import client as clientmod
from hotweights.client import connect
from hotweights.config import AttachConfig
from hotweights.loading import resident, upload
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
from hotweights.paths import daemon_paths
from hotweights.pools import cpu, cuda
from hotweights.pools.devices import resolve_device

TIMES: dict[str, float] = {}


def timed(owner: Any, name: str, label: str, *, sync: bool = True) -> Callable:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        result = original(*args, **kwargs)
        if sync:
            torch.cuda.synchronize()
        TIMES[label] = TIMES.get(label, 0.0) + time.perf_counter() - began
        return result

    setattr(owner, name, wrapper)
    return original


def hw(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hotweights", *args], check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", default="16,16,16,16,16,16")
    args = parser.parse_args()
    sock = tempfile.mkdtemp(prefix="hwp-", dir="/tmp")
    hw("daemon", "--detach", "--socket-dir", sock)
    hw("preload", "--model", args.model, "--device", "cuda", "--dtype", "bfloat16", "--socket-dir", sock)
    key = checkpoint_key(open_checkpoint(args.model), dtype="bfloat16", device=resolve_device("cuda:0"))
    got = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    assert got.ok, got.reason
    upload_fn = timed(upload, "upload", "upload")
    for owner, name in ((cpu, "import_pool"), (cuda, "fill_at"), (resident, "_from_entry")):
        timed(owner, name, name)
    timed(clientmod.Client, "publish", "publish", sync=False)
    timed(clientmod.Client, "attach", "attach_rpc", sync=False)
    with connect(daemon_paths(sock)) as client:
        began = time.perf_counter()
        resident.host_copy(client)
        print("host_copy", round(time.perf_counter() - began, 2), flush=True)
    rows = []
    threads_list = [int(t) for t in args.threads.split(",")]
    for threads in threads_list:
        upload_fn.__defaults__ = (threads,)
        resident.unmap_all()
        with connect(daemon_paths(sock)) as client:
            client.release(key.short, tier="device")
        TIMES.clear()
        profile = cProfile.Profile() if threads == threads_list[-1] and len(rows) == len(threads_list) - 1 else None
        began = time.perf_counter()
        if profile is not None:
            profile.enable()
        source = resident.map_again()
        total = time.perf_counter() - began
        if profile is not None:
            profile.disable()
            pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(15)
        rows.append({"threads": threads, "total": round(total, 3), "source": source,
                     **{k: round(v, 3) for k, v in TIMES.items()}})
        print(rows[-1], flush=True)
    subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
