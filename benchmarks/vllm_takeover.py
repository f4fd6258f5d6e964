#!/usr/bin/env python3
"""A restart that a parked vLLM engine takes over (GPU): ``hotweights vllm serve ... --park-on-exit``.

A daemon, ``hotweights preload --engine vllm``, then the launcher with ``--park-on-exit``: the first start
(timed to ``/health``), one greedy answer, SIGINT (the launcher parks the server and exits); then
``--repeat`` times: the same command again, timed from its start to the launcher's ``Woke a parked engine``
line (vLLM's ``/health`` answers 200 while it sleeps, so it cannot tell a take-over) and to the first
answer (asked once it is awake), then SIGINT. Prints one JSON object; ``same_answer`` says whether every answer
equals the first.

``--drills`` then, with the last engine parked: a second start on another port with
``--gpu-memory-utilization`` ``--beside-util`` (its budget line counts the parked engine, ``budget_line``);
``hotweights parked --wake`` of the parked one while the second runs (``refusal``: refused in one line, still
parked, when the two cannot fit); the second stopped; the same wake again (it answers the same).

Run (GPU, vLLM staged per ../shared/gpu-vllm/README.md):
    python3 benchmarks/vllm_takeover.py --model M --repeat 5 --json [--eager] [--level 1|2] [--drills]
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from hotweights.observe import complete, free_port


def wait_health(url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter()
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"not ready: rc={proc.poll()}")


def hw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotweights", *args], capture_output=True, text=True)


def gpu_used_mib() -> int:
    """MiB in use on every GPU together (one per TP rank)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return sum(int(x) for x in out.split())


def beside_drills(args: argparse.Namespace, base: list[str], sock: str, out: Path, expected: str) -> dict:
    """With one engine parked: a second start beside it, a wake refused while both cannot fit, the wake after."""
    (record,) = json.loads(hw("parked", "--json", "--socket-dir", sock).stdout)["parked"]
    result: dict = {"parked_pid": record["pid"], "parked_level": record["level"], "gpu_mib_parked": gpu_used_mib()}
    status = json.loads(hw("status", "--json", "--socket-dir", sock).stdout)
    result["keeper_parked_by_device"] = status.get("parked_by_device")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    beside = [a if a != "0.5" else args.beside_util for a in base]
    cmd = [sys.executable, "-m", "hotweights", "vllm", "serve", str(args.model), "--port", str(port), *beside,
           "--tensor-parallel-size", str(args.tensor_parallel_size), "--load-format", "hotweights",
           "--model-loader-extra-config", json.dumps({"socket_dir": sock, "fallback": False})]
    log = out / "beside.log"
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        result["beside_ready_s"] = round(wait_health(url, proc, 600) - began, 3)
        result["beside_same_answer"] = complete(url, "The weight cache", model=str(args.model)) == expected
        result["gpu_mib_both"] = gpu_used_mib()
        began = time.perf_counter()
        refused = hw("parked", "--wake", str(record["pid"]), "--socket-dir", sock)
        result["refusal"] = {"rc": refused.returncode, "seconds": round(time.perf_counter() - began, 3),
                             "said": (refused.stdout + refused.stderr).strip()[-600:]}
    except SystemExit as exc:
        result["beside_error"] = str(exc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    text = log.read_text(errors="replace")
    result["budget_line"] = next((x[-300:] for x in text.splitlines() if "held by parked engines" in x), None)
    result["beside_kv_line"] = next((x[-160:] for x in text.splitlines() if "KV cache size" in x), None)
    began = time.perf_counter()
    woke = hw("parked", "--wake", str(record["pid"]), "--json", "--socket-dir", sock)
    result["wake_after"] = {"rc": woke.returncode, "seconds": round(time.perf_counter() - began, 3),
                            "said": woke.stdout.strip()[-300:]}
    if woke.returncode == 0:
        result["wake_after"]["same_answer"] = complete(record["url"], "The weight cache",
                                                       model=str(args.model)) == expected
    return result


def changed_start(cmd: list[str], changed: list[str], url: str, out: Path) -> dict:
    """The same start with ``changed`` flags beside a parked engine: it must retire it and start on its own."""
    log = out / "changed.log"
    began = time.perf_counter()
    proc = subprocess.Popen([*cmd, *changed], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        while "Retiring the parked engine" not in log.read_text(errors="replace") and proc.poll() is None \
                and time.perf_counter() - began < 60:
            time.sleep(0.05)
        ready_s = wait_health(url, proc, 900) - began
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(180)
    text = log.read_text(errors="replace")
    return {"flags": changed, "ready_s": round(ready_s, 3), "took_over": "Woke a parked engine" in text,
            "retired_line": next((x[-300:] for x in text.splitlines() if "Retiring the parked engine" in x), None)}


def main() -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--drills", action="store_true")
    parser.add_argument("--beside-util", default="0.85")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="a parked engine of N ranks, one per GPU")
    parser.add_argument("--base", default="--dtype bfloat16 --max-model-len 512 --gpu-memory-utilization 0.5",
                        help="the engine's flags (those of a keeper given with --socket-dir: its compile is cached)")
    parser.add_argument("--socket-dir", default="", help="a keeper that holds the engine layout already: no preload")
    parser.add_argument("--changed", default="", help='then a start with these flags too (e.g. "--max-model-len '
                                                      '2048"): it must retire the parked engine, not take it over')
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-takeover-"))
    out.mkdir(parents=True, exist_ok=True)
    sock = args.socket_dir or tempfile.mkdtemp(prefix="hw-to-", dir="/tmp")
    base = [*shlex.split(args.base), *(["--enforce-eager"] if args.eager else [])]
    tp = ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    if not args.socket_dir:
        subprocess.run([sys.executable, "-m", "hotweights", "daemon", "--detach", "--socket-dir", sock], check=True,
                       stdout=subprocess.DEVNULL)
        pre = subprocess.run([sys.executable, "-m", "hotweights", "preload", "--engine", "vllm", "--model",
                              str(args.model), "--socket-dir", sock, *tp,
                              *[f"--vllm-arg={a}" for a in base + ["--enable-sleep-mode"]]],
                             capture_output=True, text=True)  # the park start's flag: in vLLM's compile-cache key
        if pre.returncode != 0:
            raise SystemExit(f"preload failed: {pre.stderr[-3000:]}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "hotweights", "vllm", "serve", str(args.model), "--port", str(port), *base, *tp,
           "--load-format", "hotweights", "--model-loader-extra-config",
           json.dumps({"socket_dir": sock, "fallback": False}), "--park-on-exit", str(args.level)]
    runs, answers, outputs = [], [], []
    for i in range(args.repeat + 1):
        log = out / f"launcher{i}.log"
        began = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        if i:  # a take-over: the parked server answers /health already; wait for the launcher's line
            while "Woke a parked engine" not in log.read_text(errors="replace") and proc.poll() is None \
                    and time.perf_counter() - began < 120:
                time.sleep(0.005)
            ready_s = time.perf_counter() - began
        else:
            ready_s = wait_health(url, proc, 600) - began
        answer_start = time.perf_counter()
        answers.append(complete(url, "The weight cache", model=str(args.model)))
        answer_s = time.perf_counter() - answer_start
        proc.send_signal(signal.SIGINT)
        park_began = time.perf_counter()
        code = proc.wait(180)
        text = log.read_text(errors="replace")
        outputs.append(text)
        runs.append({"ready_s": round(ready_s, 3), "first_answer_s": round(answer_s, 3),
                     "command_to_first_answer_s": round(answer_start + answer_s - began, 3),
                     "park_exit_s": round(time.perf_counter() - park_began, 3), "exit_code": code,
                     "took_over": "Woke a parked engine for this start" in text})
    drills = beside_drills(args, base, sock, out, answers[0]) if args.drills else None
    changed = changed_start(cmd, shlex.split(args.changed), url, out) if args.changed else None
    hw("parked", "--retire", "all", "--socket-dir", sock)
    if not args.socket_dir:
        hw("stop", "--socket-dir", sock)
    takeovers = runs[1:]
    result = {"model": args.model.name, "eager": args.eager, "level": args.level, "repeat": args.repeat,
              "tensor_parallel_size": args.tensor_parallel_size,
              "first_start_s": runs[0]["ready_s"],
              "takeover_ready_s_median": round(statistics.median(r["ready_s"] for r in takeovers), 3),
              "takeover_ready_s": [r["ready_s"] for r in takeovers],
              "command_to_first_answer_s_median":
                  round(statistics.median(r["command_to_first_answer_s"] for r in takeovers), 3),
              "first_answer_after_takeover_s_median":
                  round(statistics.median(r["first_answer_s"] for r in takeovers), 3),
              "all_took_over": all(r["took_over"] for r in takeovers), "same_answer": len(set(answers)) == 1,
              "answer": answers[0], "runs": runs,
              "lines": [x[-200:] for t in outputs for x in t.splitlines()
                        if "Woke a parked" in x or "Parked the engine" in x or "Parked " in x][:8],
              "drills": drills, "changed_start": changed,
              "command": "python3 benchmarks/vllm_takeover.py " + " ".join(sys.argv[1:]).replace(str(args.model), "M")}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    refused = changed is None or (not changed["took_over"] and changed["retired_line"] is not None)
    return 0 if result["same_answer"] and result["all_took_over"] and refused else 1


if __name__ == "__main__":
    sys.exit(main())
