#!/usr/bin/env python3
"""Parked vLLM engines (GPU): a zero-copy engine parks and wakes; beside it, vLLM's own sleep from disk.

A daemon, ``hotweights preload --engine vllm`` (the engine-layout entry), then one strict zero-copy start
with ``--enable-sleep-mode`` (``VLLM_SERVER_DEV_MODE=1`` exposes ``/sleep``, ``/wake_up``,
``/is_sleeping``). Rounds, ``--repeat`` times each, interleaved:

- ``level1``: ``POST /sleep?level=1`` (weights kept mapped), ``POST /wake_up``;
- ``level2``: ``POST /sleep?level=2`` (weights unmapped at their addresses), wake (weights from the GPU entry);
- ``host``: sleep level 2, ``hotweights demote KEY`` (host copy made, the GPU entry released), the GPU in
  use while parked (now without the keeper's entry: the engine's true residue), wake (weights from the
  host copy, which the wake publishes back as the GPU entry).

Each round: sleep time, GPU in use while parked (``nvidia-smi``), wake time, time to the first answer after
the wake, the greedy answer. Then ``--stock`` starts stock vLLM from disk with ``--enable-sleep-mode`` and
parks it at level 1 (sleep, wake, first answer, host memory it keeps while asleep). Prints one JSON object
with medians; ``same_answer`` says whether every answer equals the first; ``evidence`` counts the workers'
``Parked``/``Woke`` lines; ``memory_lines`` (vLLM's own account of each start's memory) and ``answers_part``
(where the two starts' greedy answers first differ, with the top-2 logprobs of each there) explain a
difference of KV cache or answer between the two.

Run (GPU, vLLM staged per ../shared/gpu-vllm/README.md):
    python3 benchmarks/vllm_sleep.py --model M --repeat 5 --json [--eager] [--stock] [--tensor-parallel-size 2]
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
import time
import urllib.request
from pathlib import Path

from hotweights.observe import Observed, complete, free_port
from hotweights.switch.upstream.engines import gpu_mib_by_pid
from hotweights.verify.vllm_log import facts

ROUNDS = ("level1", "level2", "host")


def gpu_used_per_gpu() -> list[int]:
    """MiB in use on each GPU this process may use, in nvidia-smi's order."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def gpu_used_mib() -> int:
    """MiB in use on every GPU together (a TP engine's ranks each hold their own)."""
    return sum(gpu_used_per_gpu())


def bare_context_mib() -> int:
    """What a process with only a CUDA context and torch's first allocation holds: the floor of a residue."""
    proc = subprocess.Popen([sys.executable, "-c", "import torch, time; torch.zeros(1, device='cuda'); "
                             "print('up', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        time.sleep(0.5)
        return gpu_mib_by_pid().get(proc.pid, 0)
    finally:
        proc.kill()
        proc.wait()


def host_used_mib() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) // 1024


def post(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b""), timeout=300) as r:
        r.read()
    return time.perf_counter() - start


def with_logprobs(url: str, model: str) -> dict:
    """The greedy answer's tokens and their top-2 logprobs: where two starts' answers part, how close it was."""
    body = {"prompt": "The weight cache", "max_tokens": 16, "temperature": 0, "logprobs": 2, "model": model}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        lp = json.loads(r.read())["choices"][0]["logprobs"]
    return {"tokens": lp["tokens"], "top": lp["top_logprobs"]}


def memory_lines(log: str) -> list[str]:
    """vLLM's own account of the start's memory (weights, activations, non-torch, graphs, KV cache)."""
    marks = ("Model loading took", "Actual usage is", "Available KV cache memory", "Estimated CUDA graph memory",
             "KV cache size")
    return [x[-420:] for x in log.splitlines() if any(m in x for m in marks)][:8]


def parting(a: dict | None, b: dict | None) -> dict | None:
    """Where two answers' tokens first differ, with both starts' top-2 logprobs there (None: same tokens)."""
    if not a or not b:
        return None
    for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])):
        if x != y:
            return {"index": i, "zero_copy_top": a["top"][i], "stock_top": b["top"][i]}
    return None


def hw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotweights", *args], capture_output=True, text=True)


def park_round(url: str, model: str, level: int, *, demote: tuple[str, list[str]] | None = None
               ) -> tuple[dict, str]:
    """One park and wake; ``demote``: (socket dir, the keys of every rank) to demote while parked."""
    sleep_s = post(f"{url}/sleep?level={level}")
    with urllib.request.urlopen(f"{url}/is_sleeping", timeout=30) as r:
        sleeping = json.loads(r.read())["is_sleeping"]
    row: dict = {}
    if demote is not None:
        row["demote_s"] = 0.0
        for key in demote[1]:
            done = hw("demote", key, "--json", "--socket-dir", demote[0])
            if done.returncode != 0:
                raise SystemExit(f"demote failed: {done.stderr[-2000:]}")
            row["demote_s"] += json.loads(done.stdout)["seconds"]
    per_gpu, host_mib, apps = gpu_used_per_gpu(), host_used_mib(), gpu_mib_by_pid()
    parked_mib = sum(per_gpu)
    wake_s = post(f"{url}/wake_up")
    start = time.perf_counter()
    answer = complete(url, "The weight cache", model=model)
    row.update({"sleep_s": round(sleep_s, 3), "is_sleeping": sleeping, "parked_gpu_mib": parked_mib,
                "parked_per_gpu_mib": per_gpu,
                "parked_host_used_mib": host_mib, "parked_processes_mib": sum(apps.values()),
                "parked_per_process_mib": apps, "wake_s": round(wake_s, 3),
                "first_answer_after_wake_s": round(time.perf_counter() - start, 3)})
    return row, answer


def entry_keys(sock: str) -> tuple[list[str], int]:
    """The keeper's entries (one per TP rank) and their bytes together."""
    rows = json.loads(hw("status", "--json", "--socket-dir", sock).stdout)["entries"]
    return [r["key"] for r in rows], sum(r["nbytes"] for r in rows)


def zero_copy(args: argparse.Namespace, base: list[str], out: Path) -> dict:
    sock = tempfile.mkdtemp(prefix="hw-sleep-", dir="/tmp")
    subprocess.run([sys.executable, "-m", "hotweights", "daemon", "--detach", "--socket-dir", sock], check=True,
                   stdout=subprocess.DEVNULL)
    tp = ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    pre = hw("preload", "--engine", "vllm", "--model", str(args.model), "--socket-dir", sock, "--json", *tp,
             *[f"--vllm-arg={a}" for a in base + ["--enable-sleep-mode"]])  # in vLLM's compile-cache key
    if pre.returncode != 0:
        raise SystemExit(f"preload failed: {pre.stderr[-3000:]}")
    keys, entry_bytes = entry_keys(sock)
    before_per_gpu = gpu_used_per_gpu()
    before_engine = sum(before_per_gpu)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model), "--port", str(port),
           *base, *tp, "--enable-sleep-mode", "--load-format", "hotweights", "--model-loader-extra-config",
           json.dumps({"socket_dir": sock, "fallback": False})]
    runs, answers = [], []
    with Observed("park", cmd, out_dir=out, health_url=f"{url}/health", env={"VLLM_SERVER_DEV_MODE": "1"}) as obs:
        receipt = obs.wait_ready(timeout_s=580, interval_s=0.2)
        if not receipt.ready:
            raise SystemExit(f"the sleep-mode start was not ready: {obs.log_text()[-3000:]}")
        answers.append(complete(url, "The weight cache", model=str(args.model)))
        logprobs = with_logprobs(url, str(args.model))
        awake_mib = gpu_used_mib()
        for _ in range(args.repeat):
            for name in ROUNDS:
                row, answer = park_round(url, str(args.model), 1 if name == "level1" else 2,
                                         demote=(sock, keys) if name == "host" else None)
                runs.append({"round": name, **row})
                answers.append(answer)
        status = json.loads(hw("status", "--json", "--socket-dir", sock).stdout)
        log = obs.log_text()
        obs.stop(grace_s=20)
    hw("stop", "--socket-dir", sock)

    def med(name: str, field: str) -> float:
        return round(statistics.median(r[field] for r in runs if r["round"] == name and field in r), 3)

    fields = ("sleep_s", "wake_s", "first_answer_after_wake_s", "parked_gpu_mib", "parked_processes_mib")
    graphs = re.search(r"Graph capturing finished in [\d.]+ secs?, took ([\d.]+) GiB", log)
    context = bare_context_mib()

    def per_gpu(name: str) -> list[float]:  # a parked engine's residue on each GPU (its rank there), median
        rows = [r["parked_per_gpu_mib"] for r in runs if r["round"] == name]
        return [statistics.median(x[i] for x in rows) - (before_per_gpu[i] if name != "host" else 0)
                for i in range(len(before_per_gpu))]

    return {"ready_s": receipt.elapsed_s, "tensor_parallel_size": args.tensor_parallel_size,
            "gpu_mib": {"daemon_only": before_engine, "engine_awake": awake_mib},
            "parked_residue_per_gpu_mib": {n: per_gpu(n) for n in ROUNDS},
            "keeper_entry_mib": round(entry_bytes / 2**20),
            "median": {n: {f: med(n, f) for f in fields} for n in ROUNDS} | {"demote_s": med("host", "demote_s")},
            # level 1/2: the keeper's entry is on the GPU beside the parked engine; host: it was released
            "parked_residue_mib": {"level1": med("level1", "parked_gpu_mib") - before_engine,
                                   "level2": med("level2", "parked_gpu_mib") - before_engine,
                                   "host": med("host", "parked_gpu_mib")},
            # what a parked engine's processes hold, split as far as can be seen from outside: a bare CUDA
            # context (+ torch's first allocation) per process, the CUDA graphs vLLM says it captured, the rest
            "residue_breakdown_mib": {
                "processes": med("level2", "parked_processes_mib"),
                "gpu_processes": len(runs[-1]["parked_per_process_mib"]), "bare_context_each": context,
                "cuda_graphs": round(float(graphs.group(1)) * 1024) if graphs else None,
                "rest": (med("level2", "parked_processes_mib") - context * len(runs[-1]["parked_per_process_mib"])
                         - (round(float(graphs.group(1)) * 1024) if graphs else 0))},
            "kv_cache_tokens": facts(log)["kv_cache_tokens"], "memory_lines": memory_lines(log), "logprobs": logprobs,
            "pinned_staging_lines": [x[-120:] for x in log.splitlines() if "pinned staging ready" in x][:2],
            "same_answer": len(set(answers)) == 1, "answer": answers[0], "runs": runs,
            "keeper_after": [{k: e[k] for k in ("key", "nbytes", "host_nbytes", "parked")} for e in status["entries"]],
            "evidence": {"parked": len(re.findall(r"Parked \S+ \(level \d\)", log)),
                         "woke_from_gpu": log.count("(weights from gpu)"),
                         "woke_from_host": log.count("(weights from host)"),
                         "woke_kept_mapped": log.count("Woke ") - log.count("(weights from ")},
            "evidence_lines": [x[-160:] for x in log.splitlines() if "Parked " in x or "Woke " in x][:6],
            "vllm_sleep_lines": [x[-200:] for x in log.splitlines() if "Sleep mode freed" in x][:3],
            "mapped": "Mapped " in log, "fallback": "falling back" in log,
            "all_sleeping": all(r["is_sleeping"] for r in runs)}


def stock(args: argparse.Namespace, base: list[str], out: Path) -> dict:
    """Stock vLLM from disk with its own sleep, level 1: what a user without hotweights gets."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model), "--port", str(port),
           *base, "--tensor-parallel-size", str(args.tensor_parallel_size), "--enable-sleep-mode"]
    runs, answers = [], []
    with Observed("stock", cmd, out_dir=out, health_url=f"{url}/health", env={"VLLM_SERVER_DEV_MODE": "1"}) as obs:
        receipt = obs.wait_ready(timeout_s=580, interval_s=0.2)
        if not receipt.ready:
            return {"ready": False, "log_tail": obs.log_text()[-2000:]}
        answers.append(complete(url, "The weight cache", model=str(args.model)))
        logprobs = with_logprobs(url, str(args.model))
        kv_tokens = facts(obs.log_text())["kv_cache_tokens"]
        memory = memory_lines(obs.log_text())
        awake_host = host_used_mib()
        for _ in range(max(1, args.stock_repeat)):
            row, answer = park_round(url, str(args.model), 1)
            row["host_kept_mib"] = row["parked_host_used_mib"] - awake_host
            runs.append(row)
            answers.append(answer)
        obs.stop(grace_s=20)
    return {"ready_s": receipt.elapsed_s, "runs": runs, "same_answer": len(set(answers)) == 1, "answer": answers[0],
            "kv_cache_tokens": kv_tokens, "memory_lines": memory, "logprobs": logprobs,
            "median": {f: round(statistics.median(r[f] for r in runs), 3)
                       for f in ("sleep_s", "wake_s", "first_answer_after_wake_s", "parked_gpu_mib", "host_kept_mib")}}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--stock", action="store_true", help="also vLLM's own sleep, weights from disk")
    parser.add_argument("--stock-repeat", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", default="0.5")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="one rank per GPU, each parks its own")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-sleep-logs-"))
    out.mkdir(parents=True, exist_ok=True)
    base = ["--dtype", "bfloat16", "--max-model-len", "512", "--gpu-memory-utilization", args.gpu_memory_utilization,
            *(["--enforce-eager"] if args.eager else [])]
    result = {"model": args.model.name, "eager": args.eager, "repeat": args.repeat,
              "zero_copy": zero_copy(args, base, out)}
    if args.stock:
        result["stock_disk"] = stock(args, base, out)
        result["same_answer_as_stock"] = result["stock_disk"].get("answer") == result["zero_copy"]["answer"]
        kv = (result["stock_disk"].get("kv_cache_tokens"), result["zero_copy"]["kv_cache_tokens"])
        result["same_kv_cache_as_stock"] = kv[0] == kv[1]
        result["answers_part"] = parting(result["zero_copy"]["logprobs"], result["stock_disk"].get("logprobs"))
    result["command"] = "python3 benchmarks/vllm_sleep.py " + " ".join(sys.argv[1:]).replace(str(args.model), "M")
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    z = result["zero_copy"]
    return 0 if z["same_answer"] and z["all_sleeping"] else 1


if __name__ == "__main__":
    os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")
    sys.exit(main())
