#!/usr/bin/env python3
"""CPU benchmark: disk load vs zero-copy attach, each into a fresh process, medians of N.

Prints one JSON line (``--json``) or a table. Figures, all medians of ``--repeat`` fresh
processes, page cache warm:

- ``disk_load_s``: safetensors ``load_file`` of every shard, then each tensor copied into
  engine-owned memory (what an engine that fills its own parameters pays).
- ``disk_lazy_s``: ``load_file`` alone. safetensors >= 0.6 maps CPU files lazily, so this
  reads no weight bytes yet; they fault in on first use.
- ``attach_s``: cache key (headers + digest cache) + zero-copy attach, no weight byte read.
- ``attach_touch_s`` / ``disk_lazy_touch_s``: the same, then every byte read once.
- ``ratio`` = disk_load_s / attach_s; ``touch_ratio`` = disk_lazy_touch_s / attach_touch_s.
- ``bitwise_equal``: every attached tensor equals the disk load, byte for byte.

Run: python benchmarks/attach_cpu.py --size 1g --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
mode, model, sock = sys.argv[1:4]
import torch
from safetensors.torch import load_file
from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint

def touch(tensors):
    total = 0
    for t in tensors.values():
        total += int(t.view(-1).view(torch.uint8)[::4096].sum()) if t.numel() else 0
    return total

def disk():
    out = {}
    for f in sorted(__import__("glob").glob(model + "/*.safetensors")):
        out.update(load_file(f))
    return out

t0 = time.perf_counter()
if mode == "disk":
    tensors = {k: v.clone() for k, v in disk().items()}
elif mode == "disk_lazy":
    tensors = disk()
elif mode == "attach":
    key = checkpoint_key(open_checkpoint(model), dtype="auto")
    r = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    assert r.ok, r.reason
    tensors = r.tensors
elif mode == "equal":
    key = checkpoint_key(open_checkpoint(model), dtype="auto")
    got = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False)).tensors
    ref = disk()
    ok = sorted(got) == sorted(ref) and all(torch.equal(got[k].view(torch.uint8), ref[k].view(torch.uint8))
                                            for k in ref)
    print(json.dumps({"equal": ok}))
    sys.exit(0)
t1 = time.perf_counter()
touch(tensors)
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "touch_s": t2 - t0}))
"""


def child(mode: str, model: Path, sock: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(model), sock], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1g")
    parser.add_argument("--model", type=Path, help="existing checkpoint (default: a demo model of --size)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from hotweights.demo_model import write_demo_model
    from hotweights.loading.preload import preload

    model = args.model or Path(tempfile.gettempdir()) / f"hotweights-bench-{args.size}"
    if not (model / "config.json").exists():
        write_demo_model(model, args.size)
    sock = tempfile.mkdtemp(prefix="hwb-", dir="/tmp")
    daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        result = preload(model, socket_dir=sock)
        for f in model.glob("*.safetensors"):  # page cache warm for the disk side
            f.read_bytes()
        runs: dict[str, list[dict]] = {m: [] for m in ("disk", "disk_lazy", "attach")}
        for _ in range(args.repeat):  # interleaved, so drift hits every mode alike
            for mode in runs:
                runs[mode].append(child(mode, model, sock))
        med = {m: (statistics.median(r["load_s"] for r in rs), statistics.median(r["touch_s"] for r in rs))
               for m, rs in runs.items()}
        equal = child("equal", model, sock)["equal"]
    finally:
        daemon.terminate()
        daemon.wait()
    line = {
        "size": args.size, "nbytes": result.nbytes, "num_tensors": result.num_tensors, "repeat": args.repeat,
        "preload_s": round(result.seconds, 4), "disk_load_s": round(med["disk"][0], 5),
        "disk_lazy_s": round(med["disk_lazy"][0], 5), "attach_s": round(med["attach"][0], 5),
        "disk_lazy_touch_s": round(med["disk_lazy"][1], 5), "attach_touch_s": round(med["attach"][1], 5),
        "ratio": round(med["disk"][0] / med["attach"][0], 1),
        "touch_ratio": round(med["disk_lazy"][1] / med["attach"][1], 2),
        "bitwise_equal": equal, "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(line))
    else:
        for k, v in line.items():
            print(f"{k:>18}: {v}")
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
