#!/usr/bin/env python3
"""GPU drill for issue 23, item 4: a preload larger than the GPU's free memory is refused in one line
before it reads a byte, and the same preload succeeds once the memory is free again.

This process holds all but ``--leave-gib`` of the GPU's free memory, runs ``hotweights preload --device
cuda`` in a subprocess (refused), frees it, runs the preload again (published). Prints one JSON line.

Run (GPU): python3 benchmarks/gpu_headroom_drill.py --model M --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import torch

GIB = 1 << 30


def preload(model: str, sock: str) -> dict:
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "hotweights", "preload", "--model", model, "--device", "cuda",
                        "--socket-dir", sock], capture_output=True, text=True)
    return {"rc": r.returncode, "seconds": round(time.monotonic() - t, 2),
            "stderr_last": (r.stderr.strip().splitlines() or [""])[-1][-400:],
            "stdout_last": (r.stdout.strip().splitlines() or [""])[-1][-300:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--leave-gib", type=float, default=0.5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sock = tempfile.mkdtemp(prefix="hw-drill-", dir="/tmp")
    daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        free, total = torch.cuda.mem_get_info(0)
        hog = torch.empty(int(free - args.leave_gib * GIB), dtype=torch.uint8, device="cuda:0")
        left = torch.cuda.mem_get_info(0)[0]
        refused = preload(args.model, sock)
        status_after_refusal = subprocess.run([sys.executable, "-m", "hotweights", "status", "--json", "--socket-dir",
                                               sock], capture_output=True, text=True).stdout
        del hog
        torch.cuda.empty_cache()
        published = preload(args.model, sock)
        status = subprocess.run([sys.executable, "-m", "hotweights", "status", "--json", "--socket-dir", sock],
                                capture_output=True, text=True).stdout
    finally:
        subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
        daemon.wait(30)
    out = {"gpu": torch.cuda.get_device_name(0), "total_gib": round(total / GIB, 2),
           "free_while_held_gib": round(left / GIB, 2), "refused": refused,
           "entries_after_refusal": len(json.loads(status_after_refusal)["entries"]), "published": published,
           "entries_after_publish": len(json.loads(status)["entries"]), "argv": sys.argv[1:]}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    ok = refused["rc"] == 1 and "needs" in refused["stderr_last"] and published["rc"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
