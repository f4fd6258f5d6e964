#!/usr/bin/env python3
"""Embedded server restart: time-to-ready (process start -> /health 200), disk vs warm, and the floor.

Interleaved runs in fresh processes, medians of ``--repeat``; polls every 50 ms. Each
run records the server's own phases from process start (the ``startup:`` line: imports,
cuda_context, tokenizer, model_build, weights, warmup, listening, ready). In the same run,
the floor: a fresh ``python -c`` that imports torch and, on a GPU, creates a CUDA context
(what no server can avoid), and the bare attach: a fresh process that, after its imports and
CUDA context, computes the cache key and attaches the entry zero-copy (the server's weights
phase does that plus installing the tensors in the model). Warm runs use ``{"fallback": false}``
and must log the Mapped line. Prints one JSON line: medians, ``warm_over_floor_s``, the
disk/warm ratio, ``weights_over_attach`` (the warm weights phase / the bare attach).

Run: python benchmarks/serve_restart.py --size 1g --json   (add --device cuda on a GPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hotweights.evidence import STARTUP_PHASES, parse_startup
from hotweights.observe import Observed, floor_s
from hotweights.verify.memory import evict_page_cache, page_cache_resident

PHASES = STARTUP_PHASES


ATTACH = r"""
import sys, time
model, sock, device = sys.argv[1:4]
import torch
from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
from hotweights.pools.devices import resolve_device
if device.startswith("cuda"):
    torch.zeros(1, device=device)
    import hotweights.pools.cuda
dev = resolve_device(device)
t = time.perf_counter()
ckpt = open_checkpoint(model, validate=False)
key = checkpoint_key(ckpt, dtype=ckpt.resolve_dtype("auto"), device=dev)
result = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
print(time.perf_counter() - t if result.ok else f"attach failed: {result.reason}")
"""


def floor_once(device: str) -> float:
    return floor_s(sys.executable, device)


def attach_once(model: Path, sock: str, device: str) -> float:
    """Seconds of a bare zero-copy attach (key + attach) in a fresh process, after its imports and context."""
    out = subprocess.run([sys.executable, "-c", ATTACH, str(model), sock, device], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    try:
        return float(out)
    except ValueError:
        raise SystemExit(out) from None


def run_once(label: str, model: Path, port: int, out: Path, args: list[str]) -> dict:
    resident = page_cache_resident(model)
    cmd = [sys.executable, "-m", "hotweights", "serve", str(model), "--port", str(port), *args]
    with Observed(label, cmd, out_dir=out, health_url=f"http://127.0.0.1:{port}/health") as obs:
        receipt = obs.wait_ready(timeout_s=600, interval_s=0.05)
        log = obs.log_text()
    line = parse_startup(log) or {}
    phases = line.get("phases", {})
    return {"ready": receipt.ready, "ready_s": receipt.elapsed_s, "weights_s": phases.get("weights"),
            "page_cache_resident": None if resident is None else round(resident, 3),
            "phases": phases, "source": line.get("source"), "engine": line.get("engine"), "mapped": "Mapped " in log,
            "fallback": "falling back to disk loading" in log}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1g")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=8191)
    parser.add_argument("--cold", action="store_true",
                        help="evict the checkpoint from the page cache before every run (a node whose page "
                             "cache was reclaimed); the daemon's pools are not page cache and stay")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from hotweights.demo_model import write_demo_model

    model = args.model or Path(tempfile.gettempdir()) / f"hotweights-bench-{args.size}"
    if not (model / "config.json").exists():
        write_demo_model(model, args.size, gen_device="cuda" if args.device.startswith("cuda") else "cpu")
    sock = tempfile.mkdtemp(prefix="hwr-", dir="/tmp")
    out = Path(tempfile.mkdtemp(prefix="hwr-logs-"))
    daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        pre = subprocess.run([sys.executable, "-m", "hotweights", "preload", "--model", str(model), "--device",
                              args.device, "--json", "--socket-dir", sock], capture_output=True, text=True, check=True)
        preload = json.loads(pre.stdout)
        strict = json.dumps({"socket_dir": sock, "fallback": False})
        runs: dict[str, list[dict]] = {"disk": [], "warm": []}
        floors: list[float] = []
        attaches: list[float] = []
        for i in range(args.repeat):
            floors.append(floor_once(args.device))
            attaches.append(attach_once(model, sock, args.device))
            if args.cold:
                evict_page_cache(model)
            runs["disk"].append(run_once(f"disk{i}", model, args.port, out,
                                         ["--device", args.device, "--load-format", "auto"]))
            if args.cold:
                evict_page_cache(model)
            runs["warm"].append(run_once(f"warm{i}", model, args.port, out,
                                         ["--device", args.device, "--model-loader-extra-config", strict]))
    finally:
        daemon.terminate()
        daemon.wait()
    med = {k: statistics.median(r["ready_s"] for r in v) for k, v in runs.items()}
    wmed = {k: statistics.median(r["weights_s"] for r in v) for k, v in runs.items()}
    phases = {k: {p: round(statistics.median(r["phases"][p] for r in v), 3) for p in PHASES} for k, v in runs.items()}
    floor = statistics.median(floors)
    ok = (all(r["ready"] for v in runs.values() for r in v) and all(r["mapped"] and not r["fallback"]
                                                                     for r in runs["warm"]))
    line = {"size": args.size, "device": args.device, "page_cache": "cold" if args.cold else "warm",
            "nbytes": preload["nbytes"], "preload_s": preload["seconds"],
            "repeat": args.repeat, "disk_ready_s": med["disk"], "warm_ready_s": med["warm"],
            "ready_ratio": round(med["disk"] / med["warm"], 2), "disk_weights_s": wmed["disk"],
            "warm_weights_s": wmed["warm"], "weights_ratio": round(wmed["disk"] / max(wmed["warm"], 1e-6), 1),
            "floor_s": round(floor, 3), "warm_over_floor_s": round(med["warm"] - floor, 3),
            "bare_attach_s": round(statistics.median(attaches), 5),
            "weights_over_attach": round(wmed["warm"] / statistics.median(attaches), 1),
            "floor_command": "python -c 'import torch" + ("; torch.zeros(1, device=...)'" if
                                                           args.device.startswith("cuda") else "'"),
            "phases_median": phases,
            "evidence_ok": ok, "runs": runs}
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
