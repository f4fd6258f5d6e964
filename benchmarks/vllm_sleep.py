#!/usr/bin/env python3
"""vLLM's own sleep with zero-copy weights (GPU): park and wake an engine whose weights are the keeper's.

A daemon, ``hotweights preload --engine vllm`` (the engine-layout entry), then one strict zero-copy start
with ``--enable-sleep-mode`` (``VLLM_SERVER_DEV_MODE=1`` exposes ``/sleep``, ``/wake_up``,
``/is_sleeping``). Per level, ``--repeat`` times: the greedy answer, ``POST /sleep?level=N`` (timed),
the GPU memory in use while parked (``nvidia-smi``) and the keeper's share of it, ``POST /wake_up``
(timed), the time to the first answer after the wake, and that answer. Prints one JSON object with the
medians; ``same_answer`` says whether every answer equals the first.

Run (GPU, vLLM staged per ../shared/gpu-vllm/README.md):
    python3 benchmarks/vllm_sleep.py --model M --repeat 5 --json [--eager]
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
import urllib.request
from pathlib import Path

from hotweights.observe import Observed, complete, free_port


def gpu_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def post(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b""), timeout=300) as r:
        r.read()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--gpu-memory-utilization", default="0.5")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sock = tempfile.mkdtemp(prefix="hw-sleep-", dir="/tmp")
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-sleep-logs-"))
    out.mkdir(parents=True, exist_ok=True)
    base = ["--dtype", "bfloat16", "--max-model-len", "512", "--gpu-memory-utilization", args.gpu_memory_utilization,
            *(["--enforce-eager"] if args.eager else [])]
    subprocess.run([sys.executable, "-m", "hotweights", "daemon", "--detach", "--socket-dir", sock], check=True)
    pre = subprocess.run([sys.executable, "-m", "hotweights", "preload", "--engine", "vllm", "--model", str(args.model),
                          "--socket-dir", sock, "--json", *[f"--vllm-arg={a}" for a in base]],
                         capture_output=True, text=True)
    if pre.returncode != 0:
        raise SystemExit(f"preload failed: {pre.stderr[-3000:]}")
    before_engine = gpu_used_mib()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model), "--port", str(port),
           *base, "--enable-sleep-mode", "--load-format", "hotweights", "--model-loader-extra-config",
           json.dumps({"socket_dir": sock, "fallback": False})]
    runs, answers = [], []
    with Observed("sleep", cmd, out_dir=out, health_url=f"{url}/health",
                  env={"VLLM_SERVER_DEV_MODE": "1"}) as obs:
        receipt = obs.wait_ready(timeout_s=580, interval_s=0.2)
        if not receipt.ready:
            raise SystemExit(f"the sleep-mode start was not ready: {obs.log_text()[-3000:]}")
        answers.append(complete(url, "The weight cache", model=str(args.model)))
        awake_mib = gpu_used_mib()
        for level in (1, 2):
            for _ in range(args.repeat):
                sleep_s = post(f"{url}/sleep?level={level}")
                with urllib.request.urlopen(f"{url}/is_sleeping", timeout=30) as r:
                    sleeping = json.loads(r.read())["is_sleeping"]
                parked_mib = gpu_used_mib()
                wake_s = post(f"{url}/wake_up")
                start = time.perf_counter()
                answers.append(complete(url, "The weight cache", model=str(args.model)))
                runs.append({"level": level, "sleep_s": round(sleep_s, 3), "is_sleeping": sleeping,
                             "parked_gpu_mib": parked_mib, "wake_s": round(wake_s, 3),
                             "first_answer_after_wake_s": round(time.perf_counter() - start, 3)})
        log = obs.log_text()
        obs.stop(grace_s=20)
    subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock])
    entry_mib = round(sum(r["nbytes"] for r in pre_rows(pre.stdout)) / 2**20) if pre_rows(pre.stdout) else None

    def med(level: int, field: str) -> float:
        return round(statistics.median(r[field] for r in runs if r["level"] == level), 3)

    result = {"model": args.model.name, "eager": args.eager, "repeat": args.repeat,
              "gpu_mib": {"daemon_only": before_engine, "engine_awake": awake_mib}, "keeper_entry_mib": entry_mib,
              "median": {f"level{n}": {f: med(n, f) for f in ("sleep_s", "wake_s", "first_answer_after_wake_s",
                                                             "parked_gpu_mib")} for n in (1, 2)},
              "parked_residue_mib": {f"level{n}": med(n, "parked_gpu_mib") - before_engine for n in (1, 2)},
              "same_answer": len(set(answers)) == 1, "answer": answers[0], "runs": runs,
              "vllm_sleep_lines": [x[-200:] for x in log.splitlines() if "Sleep mode freed" in x or "wake up" in x][:4],
              "mapped": "Mapped " in log, "fallback": "falling back" in log,
              "command": "python3 benchmarks/vllm_sleep.py " + " ".join(sys.argv[1:]).replace(str(args.model), "M")}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0 if result["same_answer"] and all(r["is_sleeping"] for r in runs) else 1


def pre_rows(stdout: str) -> list[dict]:
    try:
        return [{"nbytes": r["gib"] * 2**30} for r in json.loads(stdout.strip().splitlines()[-1])["published"]]
    except (ValueError, KeyError, IndexError):
        return []


if __name__ == "__main__":
    os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")
    sys.exit(main())
