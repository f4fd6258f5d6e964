#!/usr/bin/env python3
"""``hotweights switch`` under an A-B-A-C request mix: switch to first token, parking vs stopping and starting.

N demo models with different bytes (``demo-model --seed``; one shape, or ``--sizes`` one each), one keeper,
then per mode a front (``hotweights switch --config``, a [[model]] per model: ``--gpus`` places each on GPUs
of its own, a vLLM model on several with that tensor parallelism) and the mix m0, m1, m0, m2, m0, m1, ... (every request
asks for another model than the one before: each is a switch), one streamed completion at a time, timed
from the request to its first streamed token. Modes, in ``--modes`` order (one keeper for all):

- ``park``: the front as shipped, capped at one engine awake (``max_awake = 1``; by default every engine that fits
  stays awake, and the mix would switch nothing): the engine parks, its weights stay on the GPU; the next wakes;
- ``restart``: ``--no-parking``: the engine stops and the next starts (what llama-swap does with vLLM);
- ``vllm_sleep`` (vLLM only): the engines read the checkpoint themselves (``--load-format auto``) and park
  with vLLM's own sleep level 1 (their weights copied to host memory by vLLM, per engine);
- ``park_host``: ``--parked-weights host``: a parked engine's weights leave the GPU (the keeper keeps a host
  copy); each wake uploads them. Run it last: it leaves the keeper's entries in host memory.

Medians and p95 of ``--switches`` switches per mode (``--restart-switches`` for ``restart``, whose switch is a
whole start), the same greedy answer per model checked across modes, the front's own switch lines, and (on a
GPU) the memory each parked engine holds and the GPU and host memory in use while one model is awake.

Run: .venv/bin/python benchmarks/switch_mix.py --models 3 --switches 20 --json            (CPU, tiny models)
     python3 benchmarks/switch_mix.py --size 8b --gen-device cuda --engine vllm \\
         --engine-args "--max-model-len 512 --gpu-memory-utilization 0.25" --json         (GPU)
     ... --models 3 --sizes 8b,8b,32b --gpus "0;1;0,1"   (two GPUs: an 8B on each, a 32B with TP=2 on both)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hotweights.evidence import STANDBY_USED_RE, SWITCH_AWAKE_RE
from hotweights.observe import free_port


def first_token(url: str, model: str) -> tuple[float, str]:
    """Seconds from sending a streamed completion to its first token, and the whole greedy text."""
    body = json.dumps({"model": model, "prompt": "The weight cache", "max_tokens": 4, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"content-type": "application/json"})
    began, first, text = time.perf_counter(), None, []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            if first is None:
                first = time.perf_counter() - began
            text.append(json.loads(line[6:])["choices"][0]["text"])
    return first if first is not None else float("nan"), "".join(text)


def status(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url}/switch/status", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def model_table(name: str, path: Path, gpus: list[int], engine: str, engine_args: list[str], host: bool) -> str:
    """The model's [[model]] table: a vLLM model on several GPUs runs with that tensor parallelism."""
    tp = ["--tensor-parallel-size", str(len(gpus))] if engine == "vllm" and len(gpus) > 1 else []
    return (f"[[model]]\nname = {json.dumps(name)}\ncheckpoint = {json.dumps(str(path))}\nengine = "
            f"{json.dumps(engine)}\nargs = {json.dumps(engine_args + tp)}\n" + (f"gpus = {gpus}\n" if gpus else "")
            + ('parked_weights = "host"\n' if host else ""))


def start_front(cmd: list[str], url: str, sock: str, log: Path, label: str,
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen, float]:
    """The front ``cmd`` (serving at ``url``, keeper ``sock``, output to ``log``, ``env`` added to the environment)
    once every model is past start-up
    (up, or its start failed at least once: the front tries it again by itself, and the run records what a request
    for it gets meanwhile), and the seconds that took; SystemExit with its output when it does not get there."""
    began = time.monotonic()
    front = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                             env={**os.environ, "HOTWEIGHTS_SOCKET_DIR": sock, **(env or {})})
    while not ((state := status(url)) and all(m["state"] != "starting" or m.get("error") for m in state["models"])):
        if front.poll() is not None or time.monotonic() - began > 1800:
            front.kill()
            raise SystemExit(f"{label}: the front did not start: {log.read_text()[-3000:]}")
        time.sleep(0.5)
    return front, time.monotonic() - began


def write_models(out: Path, sizes: list[str], gen_device: str, link_shards: bool = False) -> dict[str, Path]:
    """Demo models m0, m1, ... of different bytes (seeds 0, 1, ...) under ``out``. One written whole already (its
    tokenizer_config.json comes last) is used as it is; each is written by a process of its own: generated here on
    the GPU, the models left this process holding 4.1 GiB of it (its CUDA context and cached blocks), counted in
    every memory figure of a run on an H200. ``link_shards``: every model after m0 of m0's size links m0's shards
    but its last (``demo-model --link-shards-from``: ten 8B models in 53 GB of disk). m0 first, the others several
    at a time (one at a time, ten 8B took 7 minutes on the GPU box)."""
    models = {f"m{i}": out / f"m{i}" for i in range(len(sizes))}

    def write(i: int, path: Path) -> None:
        link = ["--link-shards-from", str(models["m0"])] if link_shards and i and sizes[i] == sizes[0] else []
        subprocess.run([sys.executable, "-m", "hotweights", "demo-model", str(path), "--size", sizes[i],
                        "--gen-device", gen_device, "--seed", str(i), *link], check=True, stdout=subprocess.DEVNULL)

    todo = [(i, path) for i, path in enumerate(models.values()) if not (path / "tokenizer_config.json").exists()]
    if todo and todo[0][0] == 0:
        write(*todo.pop(0))  # the others may link its shards
    with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) // 2))) as pool:
        for done in [pool.submit(write, i, path) for i, path in todo]:
            done.result()  # the first failure raises, as one at a time did
    return models


def run_mode(mode: str, models: dict[str, Path], args: argparse.Namespace, sock: str, out: Path) -> dict:
    from vllm_sleep import gpu_used_mib, host_used_mib  # here: write_models runs where the switch's deps are not

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine_args = shlex.split(args.engine_args) + (["--load-format", "auto"] if mode == "vllm_sleep" else [])
    config = out / f"switch-{mode}.toml"
    tables = "".join(model_table(name, path, gpus, args.engine, engine_args, mode == "park_host")
                     for (name, path), gpus in zip(models.items(), args.gpu_sets))
    config.write_text("[switch]\nmax_awake = 1\n" + tables)  # one engine awake: every request of the mix a switch
    cmd = [sys.executable, "-m", "hotweights", "switch", "--config", str(config), "--port", str(port),
           "--log-dir", str(out / f"logs-{mode}"), *(["--no-parking"] if mode == "restart" else [])]
    log = out / f"front-{mode}.log"
    before = {"gpu_used_mib": gpu_used_mib(), "host_used_mib": host_used_mib()} if args.gpu else None
    front, startup_s = start_front(cmd, url, sock, log, mode)
    try:
        names = list(models)
        switches = args.restart_switches if mode == "restart" and args.restart_switches else args.switches
        mix = [names[0] if i % 2 == 0 else names[1 + (i // 2) % (len(names) - 1)] for i in range(switches + 1)]
        rows, answers = [], {}
        parked_mib = memory = None
        for i, name in enumerate(mix):
            seconds, text = first_token(url, name)
            answers.setdefault(name, set()).add(text)
            if i:  # the first request finds its model awake already
                rows.append({"model": name, "first_token_s": round(seconds, 4)})
            if i == 2 and args.gpu:
                state = status(url) or {"models": []}
                parked_mib = {m["name"]: m["gpu_mib"] for m in state["models"] if m["state"] != "awake"}
                memory = {"gpu_used_mib": gpu_used_mib(), "host_used_mib": host_used_mib(),
                          "awake": [m["name"] for m in state["models"] if m["state"] == "awake"]}
        with urllib.request.urlopen(f"{url}/metrics") as r:
            scrape = r.read().decode()
    finally:
        front.send_signal(signal.SIGINT)
        front.wait(120)
    times = [r["first_token_s"] for r in rows]
    lines = [x.split("switch: ", 1)[1] for x in log.read_text().splitlines() if "switch: " in x]
    sources = sorted({m.group(3) for m in SWITCH_AWAKE_RE.finditer(log.read_text())})
    starts = {}  # per engine log: its starts from a warm standby, and those that waited for one still importing
    for name in models:
        log_file = out / f"logs-{mode}" / f"{name}.log"
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        starts[name] = {"from_standby": len(STANDBY_USED_RE.findall(text)),
                        "waited_for_standby": text.count("Waiting for the warm standby")}
    return {"startup_s": round(startup_s, 1), "switches": len(rows),
            "first_token_p50_s": round(statistics.median(times), 4), "first_token_p95_s": round(p95(times), 4),
            "first_token_max_s": max(times), "rows": rows,
            "answers": {k: sorted(v) for k, v in answers.items()}, "parked_engine_gpu_mib": parked_mib,
            "memory_before_front": before, "memory_one_awake": memory, "sources": sources, "engine_starts": starts,
            "switch_lines": lines[:12], "metrics_switches": [x for x in scrape.splitlines()
                                                             if x.startswith("hotweights_switch_switches_total")]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--sizes", default="", help="one size per model (comma-separated), instead of --size")
    parser.add_argument("--gpus", default="", help='the GPUs of each model, ";" between models: "0;1;0,1"')
    parser.add_argument("--gen-device", default="cpu")
    parser.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"])
    parser.add_argument("--engine-args", default="--max-model-len 64")
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--modes", default="park,restart", help="park, restart, vllm_sleep, park_host (last)")
    parser.add_argument("--restart-switches", type=int, default=0, help="switches of the restart mode (0: --switches)")
    parser.add_argument("--socket-dir", default="", help="a keeper to use (and leave running): its entries serve")
    parser.add_argument("--out", type=Path, default=None, help="where the demo models are (written if not)")
    parser.add_argument("--partial-json", type=Path, default=None, help="the results so far, after each mode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.gpu = args.gen_device == "cuda" or "cuda" in args.engine_args or args.engine == "vllm"
    sizes = args.sizes.split(",") if args.sizes else [args.size] * args.models
    args.gpu_sets = [[int(g) for g in x.split(",") if g.strip()] for x in args.gpus.split(";")] if args.gpus else []
    args.gpu_sets += [[]] * (args.models - len(args.gpu_sets))
    if len(sizes) != args.models or len(args.gpu_sets) != args.models:
        raise SystemExit(f"--sizes and --gpus name {args.models} models (--models), one each")
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-switch-"))
    out.mkdir(parents=True, exist_ok=True)
    models = write_models(out, sizes, args.gen_device)
    sock = args.socket_dir or tempfile.mkdtemp(prefix="hw-switch-sock-", dir="/tmp")
    result: dict = {"models": args.models, "size": args.size, "sizes": sizes, "gpus": args.gpu_sets,
                    "engine": args.engine, "engine_args": args.engine_args}
    try:
        for mode in args.modes.split(","):
            try:
                result[mode] = run_mode(mode, models, args, sock, out)
            except (SystemExit, OSError, ValueError, subprocess.TimeoutExpired) as e:  # the next modes still run
                result[mode] = {"error": str(e)[-3000:]}
            print(json.dumps({mode: {k: v for k, v in result[mode].items() if k != "rows"}}), file=sys.stderr)
            if args.partial_json:  # what a run cut short still leaves
                args.partial_json.write_text(json.dumps(result))
    finally:
        if not args.socket_dir:
            subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
    modes = [m for m in args.modes.split(",") if "answers" in result.get(m, {})]
    result["same_answers_across_modes"] = len({json.dumps(result[m]["answers"]) for m in modes}) == 1
    for other in ("restart", "vllm_sleep", "park_host"):
        if {"park", other} <= set(modes):
            result[f"{other}_over_park_p50"] = round(result[other]["first_token_p50_s"]
                                                     / result["park"]["first_token_p50_s"], 1)
    result["command"] = "benchmarks/switch_mix.py " + " ".join(sys.argv[1:])
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
