#!/usr/bin/env python3
"""Filling a box with vLLM models, before and after (issue 55): each model's preload and then its first start.

Two demo models of one config (``--models``, seeds 0, 1, ...), each ``hotweights preload --engine vllm`` into an
empty keeper and then its first ``hotweights vllm serve`` (``--load-format hotweights``, fallback off, torch.compile
on: no ``--enforce-eager``), asked once and stopped; the fill is the sum over the models. Modes, interleaved ABBA
over ``--rounds``, each run with a compile cache of its own (``VLLM_CACHE_ROOT``, empty: the cold box):

- ``whole``: the preload as it was (``HOTWEIGHTS_VLLM_SERVER_PRELOAD=1``: a whole vLLM start, which compiles and
  leaves its compile cache for the first start) and vLLM's own compile-cache key (``HOTWEIGHTS_VLLM_COMPILE_KEY=path``);
- ``alone``: the defaults: vLLM's loader without a vLLM start (``engines/vllm/publish.py``), the first start
  compiles, and a model of a config compiled before finds it (``compile_key.py``).

Every start's answer is recorded; within a mode they must agree with that model's other starts. On the CPU build,
vLLM cannot load its AOT artifacts (0.26: ``'function' object has no attribute 'finalize_loading'``), so the
shared key saves only what inductor's own caches under it hold; on a GPU it loads them.

Run: HOTWEIGHTS_VLLM_PYTHON=~/.cache/hotweights/vllm026-venv/bin/python .venv/bin/python benchmarks/vllm_fill_ab.py \
         --rounds 2 --json
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

from vllm_run import run_vllm

from hotweights.observe import free_port

MODES = {"whole": {"HOTWEIGHTS_VLLM_SERVER_PRELOAD": "1", "HOTWEIGHTS_VLLM_COMPILE_KEY": "path"}, "alone": {}}


def fill(mode: str, models: list[Path], python: str, out: Path, args: list[str]) -> dict:
    sock = tempfile.mkdtemp(prefix="hw-fill-", dir="/tmp")
    env = {**os.environ, **MODES[mode], "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="hw-vcache-", dir="/tmp"),
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    rows = []
    try:
        for model in models:
            began = time.monotonic()
            pre = subprocess.run([sys.executable, "-m", "hotweights", "preload", "--engine", "vllm", "--model",
                                  str(model), "--dtype", "bfloat16", "--socket-dir", sock, "--vllm-python", python,
                                  *[f"--vllm-arg={a}" for a in args], "--json"],
                                 capture_output=True, text=True, env=env, timeout=900)
            preload_s = time.monotonic() - began
            if pre.returncode != 0:
                raise SystemExit(f"{mode}: the preload of {model.name} failed: {pre.stderr[-2000:]}")
            port = free_port()
            extra = json.dumps({"socket_dir": sock, "fallback": False})
            start = run_vllm(f"{mode}-{model.name}", [python, "-m", "hotweights", "vllm", "serve", str(model),
                                                      "--port", str(port), "--dtype", "bfloat16", *args,
                                                      "--load-format", "hotweights", "--model-loader-extra-config",
                                                      extra], out=out, port=port, env=env, model=str(model))
            if not start.get("ready"):
                raise SystemExit(f"{mode}: the start of {model.name} failed: {start['log'][-2000:]}")
            rows.append({"model": model.name, "preload_s": round(preload_s, 2), "start_s": round(start["ready_s"], 2),
                         "started_up": json.loads(pre.stdout)["started_up"], "answer": start["answer"]})
    finally:
        subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
        subprocess.run([python, "-m", "hotweights", "standby", "--stop", "--socket-dir", sock], capture_output=True,
                       timeout=120)
    return {"fill_s": round(sum(r["preload_s"] + r["start_s"] for r in rows), 2), "models": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=2)
    p.add_argument("--size", default="small")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--vllm-arg", action="append", default=["--max-model-len=256"])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    python = os.environ.get("HOTWEIGHTS_VLLM_PYTHON")
    if not python:
        raise SystemExit("set HOTWEIGHTS_VLLM_PYTHON to the Python that runs vLLM")
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-fill-ab-"))
    from hotweights.demo_model import write_demo_model

    models = [write_demo_model(out / f"m{i}", args.size, seed=i) for i in range(args.models)]
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in (["whole", "alone"] if r % 2 == 0 else ["alone", "whole"]):  # ABBA
            runs[mode].append(fill(mode, models, python, out, args.vllm_arg))
            print(f"round {r + 1} {mode}: {runs[mode][-1]['fill_s']} s", file=sys.stderr, flush=True)
    answers = {m: {row["model"]: {x["answer"] for run in runs[m] for x in run["models"] if x["model"] == row["model"]}
                   for row in runs[m][0]["models"]} for m in MODES}
    consistent = all(len(a) == 1 for per in answers.values() for a in per.values())
    med = {m: statistics.median(run["fill_s"] for run in runs[m]) for m in MODES}
    result = {"models": args.models, "size": args.size, "vllm_args": args.vllm_arg, "rounds": args.rounds,
              "fill_s_median": med, "fill_s_range": {m: [min(x["fill_s"] for x in runs[m]),
                                                         max(x["fill_s"] for x in runs[m])] for m in MODES},
              "ratio_alone_over_whole": round(med["alone"] / med["whole"], 3), "answers_consistent": consistent,
              "runs": runs}
    print(json.dumps(result, indent=1) if args.json else
          f"fill of {args.models}: whole {med['whole']:.1f} s, alone {med['alone']:.1f} s "
          f"({result['ratio_alone_over_whole']:.2f}x); answers consistent: {consistent}")
    return 0 if consistent else 1


if __name__ == "__main__":
    sys.exit(main())
