#!/usr/bin/env python3
"""The read-ahead of ``hotweights switch``'s start-up (``switch/readahead.py``) against none, on this machine's disk:
a vLLM preload of a model whose pages are not in the page cache (a box just booted), with and without the model's
shards read into the page cache from the moment the preload begins, as the front does.

Each round evicts the model's pages (``verify.memory.evict_page_cache``: what a reboot does to them), releases the
keeper's entry, then times ``hotweights preload --engine vllm`` (vLLM's loader alone, vLLM's CPU build) until it
returns, in the mode of the round: ``plain`` or ``read_ahead`` (``readahead.read_into_cache`` of its shards in a
thread begun with the preload). The preload imports vLLM itself (``HOTWEIGHTS_VLLM_STANDBY=off``), as the first
preload of a cold front does: no standby has vLLM imported yet. Rounds alternate the two modes, ABBA; the last line
is the medians, their ratio and every round, as one JSON object.

The model: the demo model's ``1g`` shape with ``--layers`` layers (44: 4.4 GB), written once to ``--models-dir``.

Run:  python3 benchmarks/readahead_cpu.py --vllm-python ~/.cache/hotweights/vllm-venv/bin/python [--rounds 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hotweights import demo_model
from hotweights.switch.readahead import read_into_cache, shard_paths
from hotweights.verify.memory import evict_page_cache


def one(python: str, model: Path, sock: str, read_ahead: bool) -> dict:
    """One preload from a cold page cache; its seconds, and the read-ahead's where it ran."""
    paths = shard_paths(model)
    subprocess.run([sys.executable, "-m", "hotweights", "release", "--all", "--socket-dir", sock],
                   capture_output=True, check=True)
    evict_page_cache(model)
    env = {**os.environ, "HOTWEIGHTS_VLLM_STANDBY": "off", "VLLM_CPU_KVCACHE_SPACE": "1"}
    read_s: list[float] = []

    def ahead() -> None:
        began = time.perf_counter()
        read_into_cache(paths)
        read_s.append(time.perf_counter() - began)

    began = time.perf_counter()
    reader = threading.Thread(target=ahead) if read_ahead else None
    if reader is not None:
        reader.start()
    done = subprocess.run([python, "-m", "hotweights", "preload", "--engine", "vllm", "--model", str(model),
                           "--socket-dir", sock, "--json"], capture_output=True, text=True, env=env)
    took = time.perf_counter() - began
    if reader is not None:
        reader.join()
    if done.returncode != 0:
        raise SystemExit(f"the preload failed: {done.stderr[-2000:]}")
    return {"mode": "read_ahead" if read_ahead else "plain", "preload_s": round(took, 2),
            "read_ahead_s": round(read_s[0], 2) if read_s else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=os.environ.get("HOTWEIGHTS_VLLM_PYTHON", ""))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--layers", type=int, default=44)
    parser.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "hw-readahead")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if not args.vllm_python:
        raise SystemExit("--vllm-python (or $HOTWEIGHTS_VLLM_PYTHON): the Python of vLLM's CPU build")
    size = f"1g-{args.layers}"
    demo_model.SHAPES[size] = dataclasses.replace(demo_model.SHAPES["1g"], num_hidden_layers=args.layers)
    model = args.models_dir / size
    if not (model / "config.json").is_file():
        demo_model.write_demo_model(model, size)
    nbytes = sum(p.stat().st_size for p in shard_paths(model))
    sock = tempfile.mkdtemp(prefix="hwra-", dir="/tmp")
    subprocess.run([sys.executable, "-m", "hotweights", "daemon", "--detach", "--socket-dir", sock], check=True,
                   capture_output=True)
    rows = []
    try:
        for r in range(args.rounds):
            rows.append({"round": r, **one(args.vllm_python, model, sock, read_ahead=r % 4 in (1, 2))})  # ABBA
            print(rows[-1], flush=True)
    finally:
        subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
    medians = {m: statistics.median(x["preload_s"] for x in rows if x["mode"] == m) for m in ("plain", "read_ahead")}
    summary = {"what": "a vLLM preload (loader alone, vLLM's CPU build, importing vLLM itself) of a model whose pages "
                       "are not cached, with and without the read-ahead of its shards begun with it",
               "model_bytes": nbytes, "median_preload_s": medians,
               "ratio_read_ahead_over_plain": round(medians["read_ahead"] / medians["plain"], 2),
               "read_ahead_s_median": statistics.median(x["read_ahead_s"] for x in rows if x["read_ahead_s"]),
               "cpus": os.cpu_count(), "rounds": rows,
               "command": "python3 benchmarks/readahead_cpu.py " + " ".join(sys.argv[1:])}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
