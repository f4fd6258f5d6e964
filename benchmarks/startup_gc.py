"""Where the server's start spends its GIL: garbage collection, and the side thread's web import.

``hotweights serve`` imports torch (~0.5M objects), then loads the model, warms it up and
imports the HTTP stack (starlette, pydantic, uvicorn). Every full collection in that window
walks the whole heap, and the import competes with the model phases for the GIL. Fresh
processes, interleaved, medians; clock from after the imports: CUDA context (``--device
cuda``), build + weights (``load_s``, of which ``weights_s`` is the server's weights phase),
warm-up, and everything ready (``all_ready_s``: model warmed up and web stack imported), with
the collector's time (``gc.callbacks``). Variants: the load alone (no web import); the import
on a side thread from the start, heap as imported / frozen; the import on a side thread
started once the weights are in, beside the warm-up (what ``serve`` does on a GPU); the
import on the main thread after the warm-up (what ``serve`` does on a CPU device).

Needs a daemon holding ``--model`` (``hotweights preload``).

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
model, sock, device, side_at, freeze = sys.argv[1:6]
import torch
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
if side_at == "start":
    side.start()
if device.startswith("cuda"):
    torch.zeros(1, device=device)
    from hotweights.pools import cuda as _driver
    from hotweights.pools.devices import resolve_device
    resolve_device(device)
t1 = time.perf_counter()
model_, report = load_model(model, device=device, config={"socket_dir": sock, "fallback": False}, impl="auto")
t2 = time.perf_counter()
if side_at == "after_load":
    side.start()
with torch.inference_mode():
    model_.warm_up()
if device.startswith("cuda"):
    torch.cuda.synchronize()
t3 = time.perf_counter()
if side_at != "none":
    side.module()
print(json.dumps({"context_s": t1 - t0, "load_s": t2 - t1, "weights_s": report.weights_s, "warmup_s": t3 - t2,
                  "all_ready_s": time.perf_counter() - t0, "gc_s": collected[0], "source": str(report.source)}))
"""

# name: (when the side thread starts importing the web stack, heap frozen after the imports)
# "end": no side thread, the main thread imports it after the warm-up (serve on a CPU device)
VARIANTS = {"load_alone": ("none", "1"), "import_at_start": ("start", "0"), "import_at_start_frozen": ("start", "1"),
            "import_after_load_frozen": ("after_load", "1"), "import_at_end_frozen": ("end", "1")}
KEYS = ("context_s", "load_s", "weights_s", "warmup_s", "all_ready_s", "gc_s")


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
        for name, (side_at, freeze) in VARIANTS.items():
            out = subprocess.run([sys.executable, "-c", CHILD, args.model, args.socket_dir, args.device, side_at,
                                  freeze], capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    if any(r["source"] != "cache" for rs in runs.values() for r in rs):
        raise SystemExit("a run did not attach from the cache: preload the model into that daemon first")
    line = {"model": args.model, "device": args.device, "repeat": args.repeat,
            "median": {name: {k: round(statistics.median(r[k] for r in rs), 4)
                              for k in KEYS} for name, rs in runs.items()},
            "runs": runs}
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
