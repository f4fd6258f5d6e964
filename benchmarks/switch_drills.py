#!/usr/bin/env python3
"""``hotweights switch`` as a user runs it, from an empty keeper, and its fault drills (issue 42's GPU rerun).

Starts ``hotweights switch --model m0=M0 --model m1=M1 ... --engine ENGINE -- ENGINE ARGS`` with a keeper
directory of its own (empty: every model is preloaded by the front), and times it to ``/health`` and until every
model is started; reads each model's ``ready in`` line and, per engine log, its starts from a warm standby and
whether vLLM compiled (``compiled``: a start that found vLLM's compile cache loads it instead). Then:

- an A-B-A-C mix of ``--switches`` streamed completions (switch to first token, p50/p95);
- a parked engine killed -9 and asked for (answered by its restart, the same answer);
- the awake engine killed -9 and asked for at once (answered by its restart, not a 503);
- optionally the trace of ``switch_trace.py`` against this front (``--trace-s``);
- SIGTERM to the front: it must exit, and leave no engine process and no port behind (the keeper keeps the
  weights; the front's last line says so).

Run (GPU): python3 benchmarks/switch_drills.py --models-dir W --engine vllm \\
               --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.25" --trace-s 60 --json
     (CPU): .venv/bin/python benchmarks/switch_drills.py --switches 6 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from switch_mix import first_token, p95, status, write_models
from switch_trace import make_trace, run_trace
from vllm_sleep import gpu_used_mib, host_used_mib

from hotweights.evidence import STANDBY_USED_RE
from hotweights.observe import free_port, healthy
from hotweights.unix import pid_alive

COMPILED_RE = re.compile(r"torch\.compile takes ([\d.]+) s in total|Compiling a graph for")
LOADED_RE = re.compile(r"Directly load the compiled graph|loading the compiled graph|Compile cache hit", re.I)


def engine_logs(log_dir: Path) -> dict:
    out = {}
    for log in sorted(log_dir.glob("*.log")):
        text = log.read_text(errors="replace")
        out[log.stem] = {"from_standby": len(STANDBY_USED_RE.findall(text)),
                         "waited_for_standby": text.count("Waiting for the warm standby"),
                         "compiled": len(COMPILED_RE.findall(text)),
                         "compile_cache_loads": len(LOADED_RE.findall(text)),
                         "standby_lines": [x[-160:] for x in text.splitlines() if "warm standby" in x][:6]}
    return out


def taken(port: int) -> bool:
    """Whether something accepts on the port (an orphan that holds it answers no /health, but it accepts)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def gpu_apps() -> str:
    """nvidia-smi's compute processes (after SIGTERM: the keeper alone should be left)."""
    got = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return got.stdout.strip() or got.stderr.strip()


def ask(url: str, name: str) -> tuple[float, str]:
    began = time.perf_counter()
    _, text = first_token(url, name)
    return round(time.perf_counter() - began, 3), text


def kill_and_ask(url: str, name: str, expected: str) -> dict:
    row = next(m for m in status(url)["models"] if m["name"] == name)
    os.kill(row["server_pid"], signal.SIGKILL)  # the server itself, as a crash ends it (not its launcher)
    seconds, text = ask(url, name)
    after = next(m for m in status(url)["models"] if m["name"] == name)
    return {"killed_state": row["state"], "killed_pid": row["server_pid"], "answered_s": seconds, "same_answer":
            text == expected, "state_after": after["state"], "new_pid": after["pid"]}


def main() -> int:  # noqa: C901, PLR0915
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--gen-device", default="cpu")
    parser.add_argument("--models-dir", type=Path, default=None, help="where the demo models are (written if not)")
    parser.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"])
    parser.add_argument("--engine-args", default="--max-model-len 4096")
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--trace-s", type=float, default=0.0, help="switch_trace.py's trace against this front")
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--socket-dir", default="", help="the keeper's directory (default: a new one); it is left "
                                                         "running when given, with the weights the front preloaded")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    gpu = args.gen_device == "cuda" or args.engine == "vllm"
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-drills-"))
    out.mkdir(parents=True, exist_ok=True)
    models = write_models(args.models_dir or out, [args.size] * args.models, args.gen_device)
    sock = args.socket_dir or tempfile.mkdtemp(prefix="hw-drills-sock-", dir="/tmp")  # empty: the front preloads
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    pairs = [x for n, p in models.items() for x in ("--model", f"{n}={p}")]
    cmd = [sys.executable, "-m", "hotweights", "switch", *pairs, "--engine", args.engine, "--port", str(port),
           "--log-dir", str(out / "logs"), "--",
           *shlex.split(args.engine_args)]
    result: dict = {"command": "hotweights " + " ".join(cmd[3:]).replace(str(args.models_dir or out), "W")
                    .replace(str(out), "OUT")}
    log = out / "front.log"
    partial = out / "drills.partial.json"  # after each step: a later step that fails loses nothing before it
    memory_before = {"gpu_used_mib": gpu_used_mib(), "host_used_mib": host_used_mib()} if gpu else None
    began = time.monotonic()
    pids: list[int] = []
    ports: list[int] = []
    front = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                             env={**os.environ, "HOTWEIGHTS_SOCKET_DIR": sock})
    try:
        while not healthy(f"{url}/health"):
            if front.poll() is not None or time.monotonic() - began > 1800:
                raise SystemExit(f"the front did not serve: {log.read_text()[-3000:]}")
            time.sleep(0.2)
        result["health_s"] = round(time.monotonic() - began, 1)
        while any(m["state"] == "starting" for m in status(url)["models"]):
            time.sleep(0.5)
        result["all_started_s"] = round(time.monotonic() - began, 1)
        result["states_started"] = {m["name"]: m["state"] for m in status(url)["models"]}
        result["ready_lines"] = [x.split("switch: ", 1)[1] for x in log.read_text().splitlines() if " ready in " in x]
        if gpu:
            result["memory"] = {"before": memory_before, "all_parked": {"gpu_used_mib": gpu_used_mib(),
                                                                         "host_used_mib": host_used_mib()},
                                "parked_engine_gpu_mib": {m["name"]: m["gpu_mib"] for m in status(url)["models"]}}
        partial.write_text(json.dumps(result))
        names = list(models)
        expected = {n: ask(url, n)[1] for n in names}
        mix = [names[0] if i % 2 == 0 else names[1 + (i // 2) % (len(names) - 1)] for i in range(args.switches)]
        times, same = [], True
        for name in mix:
            seconds, text = ask(url, name)
            times.append(seconds)
            same &= text == expected[name]
        result["mix"] = {"switches": len(times), "first_token_p50_s": round(statistics.median(times), 4),
                         "first_token_p95_s": round(p95(times), 4), "max_s": max(times), "same_answers": same}
        partial.write_text(json.dumps(result))
        ask(url, names[0])
        for drill in ("parked_killed", "awake_killed"):  # the second finds it awake since the first
            try:
                result[drill] = kill_and_ask(url, names[-1], expected[names[-1]])
            except OSError as exc:  # a drill that fails is a result: the next steps still run
                result[drill] = {"same_answer": False, "error": str(exc)[:300]}
            partial.write_text(json.dumps(result))
        if args.trace_s:
            trace_args = argparse.Namespace(seed=0, rate=args.rate, zipf_s=1.1, duration_s=args.trace_s,
                                            burst_every_s=20.0, burst_size=4, prompt_range=(32, 2000),
                                            max_tokens_range=(16, 128), probe_every=5, slo_s=2.0,
                                            request_timeout_s=120.0, gpu=gpu)
            try:
                result["trace"] = run_trace(url, make_trace(names, trace_args), trace_args)
            except Exception as exc:  # a benchmark's own failure: SIGTERM's check below still runs
                result["trace"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            partial.write_text(json.dumps(result))
        pids = [p for m in status(url)["models"] for p in (m["pid"], m.get("server_pid")) if p]
        ports = [m["port"] for m in status(url)["models"] if m["port"]]
    finally:
        stopped = time.monotonic()
        front.send_signal(signal.SIGTERM)
        code = front.wait(180)
    time.sleep(1)
    result["sigterm"] = {"exit_code": code, "seconds": round(time.monotonic() - stopped, 1),
                         "processes_left": [p for p in pids if pid_alive(p, others=False)],
                         "ports_left": [p for p in [port, *ports] if taken(p)],
                         "gpu_processes_after": gpu_apps() if gpu else None,
                         "last_lines": log.read_text().splitlines()[-3:]}
    result["engine_logs"] = engine_logs(out / "logs")
    partial.write_text(json.dumps(result))
    if not args.socket_dir:
        subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    ok = result["mix"]["same_answers"] and all(result[k]["same_answer"] for k in ("parked_killed", "awake_killed"))
    return 0 if ok and not result["sigterm"]["processes_left"] and not result["sigterm"]["ports_left"] else 1


if __name__ == "__main__":
    sys.exit(main())
