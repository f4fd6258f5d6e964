"""What garbage collection costs the server's model phases, and what freezing the heap saves.

``hotweights serve`` imports torch (~0.5M objects), then loads the model while, on a GPU, a
side thread imports the HTTP stack. Every full collection in that window walks the whole
heap while holding the GIL both threads need. Fresh processes, interleaved, medians of the
build + weights of ``load_model`` and of the time until the web module is ready too, with the
collector's time (``gc.callbacks``), for: the load alone; beside the side import with the
heap as imported; beside it with the heap frozen after the imports (what ``serve`` does).

Needs a daemon holding ``--model`` (``hotweights preload``); ``--device cuda`` makes the CUDA
context before the clock, as the server does.

Run: python benchmarks/startup_gc.py --model M --socket-dir D [--device cuda] --repeat 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import gc, json, sys, time
model, sock, device, side_import, freeze = sys.argv[1:6]
import torch
if device.startswith("cuda"):
    torch.zeros(1, device=device)
    from hotweights.pools import cuda as _driver
    from hotweights.pools.devices import resolve_device
    resolve_device(device)
from hotweights.engines.transformers import load_model
from hotweights.serve.app import SideImport
if freeze == "1":
    gc.freeze()
collected, started = [0.0], [0.0]
def on_gc(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        collected[0] += time.perf_counter() - started[0]
gc.callbacks.append(on_gc)
side = SideImport("hotweights.serve.web")
t0 = time.perf_counter()
if side_import == "1":
    side.start()
model_, report = load_model(model, device=device, config={"socket_dir": sock, "fallback": False}, impl="auto")
t1 = time.perf_counter()
if side_import == "1":
    side.module()
print(json.dumps({"load_s": t1 - t0, "weights_s": report.weights_s, "both_ready_s": time.perf_counter() - t0,
                  "gc_s": collected[0], "source": str(report.source)}))
"""

VARIANTS = {"load_alone": ("0", "1"), "beside_import": ("1", "0"), "beside_import_frozen": ("1", "1")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--socket-dir", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    for _ in range(args.repeat):
        for name, (side_import, freeze) in VARIANTS.items():
            out = subprocess.run([sys.executable, "-c", CHILD, args.model, args.socket_dir, args.device, side_import,
                                  freeze], capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    if any(r["source"] != "cache" for rs in runs.values() for r in rs):
        raise SystemExit("a run did not attach from the cache: preload the model into that daemon first")
    line = {"model": args.model, "device": args.device, "repeat": args.repeat,
            "median": {name: {k: round(statistics.median(r[k] for r in rs), 4)
                              for k in ("load_s", "weights_s", "both_ready_s", "gc_s")} for name, rs in runs.items()},
            "runs": runs}
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
