#!/usr/bin/env python3
"""Where a wake from the host copy spends its time (GPU, no vLLM): ``loading/resident.map_again`` timed by part.

A daemon, ``preload --device cuda`` of MODEL, one zero-copy attach, ``tiers.host_copy`` four times (its host copy
released in between, ABBA: ``pinned``, one DMA into the copy's pages registered for it, ``tiers.PINNED_DOWNLOAD``,
against ``pageable``, the plain copy), each timed; then rounds: unmap
(a deep park), release the keeper's GPU entry, ``map_again`` (from the host copy: map its memfd, a new CUDA
pool, the copy, publish, map at the same addresses). Each round prints the total and the seconds of each timed
part (``fill_at`` (a new allocation at the same addresses, the copy inside it), ``upload`` or ``pinned_copy``,
``publish``, ``attach_rpc``, ``_from_entry``); the last round of each kind also runs under cProfile (their top 12 by own
time to stderr); the last line is the medians and every round as one JSON object.

Rounds take the wakes from a host copy in turn, interleaved: ``pinned`` (the copy pinned while parked,
``resident.PIN_AHEAD``: one DMA a pool, all queued and one wait, ``resident.QUEUED_COPIES``), ``pinned_each``
(the same, each pool's DMA waited for before the next pool is allocated: the wake before 2026-12-05b) and
``stages`` (the upload through pinned stages); each round waits, untimed, for what its park readied (the pinning,
or the stages), as a parked engine would have.

Run (GPU):  python3 benchmarks/host_wake_profile.py MODEL [--rounds 9] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
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
from hotweights.loading import resident, tiers, upload
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


def rounds(count: int, wakes: tuple[str, ...], key: Any, sock: str) -> list[dict]:
    """``count`` wakes from the host copy, the kinds of ``wakes`` in turn: each its total and timed parts."""
    rows = []
    for r in range(count):
        wake = wakes[r % len(wakes)]
        resident.PIN_AHEAD, resident.QUEUED_COPIES = wake != "stages", wake == "pinned"
        resident.unmap_all()
        for h in resident.held():  # parked a while: what the park readied is ready
            if h.pinning is not None:
                h.pinning.join()
        for warming in upload._WARMING:
            warming.join()
        with connect(daemon_paths(sock)) as client:
            client.release(key.short, tier="device")
        TIMES.clear()
        profile = cProfile.Profile() if r >= count - len(wakes) else None
        began = time.perf_counter()
        if profile is not None:
            profile.enable()
        again = resident.map_again()
        total = time.perf_counter() - began
        if profile is not None:
            profile.disable()
            print(f"== {wake}", file=sys.stderr)
            pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(12)
        rows.append({"round": r, "wake": wake, "total": round(total, 3),
                     "source": again.source, "rate": again.rate(), **{k: round(v, 3) for k, v in TIMES.items()}})
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=9, help="wakes, pinned, pinned_each and stages in turn")
    parser.add_argument("--json-out", default="", help="also write the rounds and medians here")
    args = parser.parse_args()
    sock = tempfile.mkdtemp(prefix="hwp-", dir="/tmp")
    hw("daemon", "--detach", "--socket-dir", sock)
    hw("preload", "--model", args.model, "--device", "cuda", "--dtype", "bfloat16", "--socket-dir", sock)
    key = checkpoint_key(open_checkpoint(args.model), dtype="bfloat16", device=resolve_device("cuda:0"))
    got = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    assert got.ok, got.reason
    timed(upload, "upload", "upload")
    timed(upload.Pinned, "copy_to", "pinned_copy", sync=False)  # queued: the wait is seal_at's (or its own)
    timed(cuda, "fill_at", "fill_at", sync=False)
    for owner, name in ((cpu, "import_pool"), (cuda, "seal_at"), (resident, "_from_entry")):
        timed(owner, name, name)
    timed(clientmod.Client, "publish", "publish", sync=False)
    timed(clientmod.Client, "attach", "attach_rpc", sync=False)
    host_copies: dict[str, list[float]] = {"pinned": [], "pageable": []}
    with connect(daemon_paths(sock)) as client:
        for r in range(4):  # the host copy itself, ABBA: one DMA into registered pages, or the pageable copy
            way = "pinned" if r % 3 == 0 else "pageable"
            tiers.PINNED_DOWNLOAD = way == "pinned"
            if r:
                client.release(key.short, tier="host")
            began = time.perf_counter()
            tiers.host_copy(client)
            host_copies[way].append(round(time.perf_counter() - began, 3))
            print("host_copy", way, host_copies[way][-1], flush=True)
        tiers.PINNED_DOWNLOAD = True
    wakes = ("pinned", "pinned_each", "stages")
    rows = rounds(args.rounds, wakes, key, sock)
    medians = {w: statistics.median(x["total"] for x in rows if x["wake"] == w) for w in wakes
               if any(x["wake"] == w for x in rows)}
    ratios = {f"{w}_over_pinned": round(medians[w] / medians["pinned"], 2) for w in medians if w != "pinned"}
    summary = {"bytes": sum(h.manifest.nbytes for h in resident.held()), "median_s": medians, **ratios,
               "host_copy_s": host_copies, "rounds": rows,
               "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "command": "python3 benchmarks/host_wake_profile.py " + " ".join(sys.argv[1:])}
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
