#!/usr/bin/env python3
"""The loader-alone preload from a warm standby, before and after (issue 55): ``hotweights preload --engine vllm``
of one demo model into a keeper, its entry released between runs, interleaved ABAB over ``--rounds``:

- ``plain``: ``HOTWEIGHTS_VLLM_STANDBY=off``: the loader's process imports vLLM itself (as every preload did);
- ``standby``: a standby of that Python ready first (``hotweights standby`` says so): the loader runs in it
  (``engines/vllm/launcher.run_module``), and its log says ``Started vLLM from a warm standby``.

Prints each run's wall seconds (the CLI's, from the outside), the medians and their ratio. On an H200 each 8B
loader-alone preload took 23-29 s beside the starts, of which the import of vLLM is a part this measures on the CPU.

Run: HOTWEIGHTS_VLLM_PYTHON=~/.cache/hotweights/vllm026-venv/bin/python .venv/bin/python \\
         benchmarks/preload_standby_ab.py --rounds 3 --json
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

from hotweights import evidence


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotweights", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


PREPARE = ("import os, sys; from pathlib import Path; from hotweights.standby import handoff; "
           "from hotweights.engines.vllm.standby import SPEC; "
           "print(handoff.prepare(SPEC, Path(sys.argv[1]), dict(os.environ), settle_s=handoff.SETTLE_S))")


def wait_for_standby(python: str, sock: Path, env: dict[str, str], timeout_s: float = 240) -> None:
    """A standby of ``python`` for ``env`` ready (one prepared where none is: a plain run leaves none)."""
    subprocess.run([python, "-c", PREPARE, str(sock)], capture_output=True, text=True, timeout=60, check=True,
                   env={**os.environ, **env})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = subprocess.run([python, "-m", "hotweights", "standby", "--socket-dir", str(sock), "--json"],
                               capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        if json.loads(state.stdout).get("ready"):
            return
        time.sleep(0.5)
    raise SystemExit(f"no standby became ready: {state.stdout}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", default="small")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    python = os.environ.get("HOTWEIGHTS_VLLM_PYTHON")
    if not python:
        raise SystemExit("set HOTWEIGHTS_VLLM_PYTHON to the Python with vLLM (make test's venvs)")
    work = Path(tempfile.mkdtemp(prefix="hw-pre-", dir="/tmp"))
    sock = work / "sock"
    sock.mkdir(mode=0o700)
    model = work / "model"
    cli("demo-model", str(model), "--size", args.size)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    runs: dict[str, list[float]] = {"plain": [], "standby": []}
    try:
        for _ in range(args.rounds):
            for mode in ("plain", "standby"):
                cli("release", "--all", "--socket-dir", str(sock))
                if mode == "standby":
                    wait_for_standby(python, sock, env)
                began = time.monotonic()
                done = cli("preload", "--engine", "vllm", "--model", str(model), "--dtype", "bfloat16",
                           "--socket-dir", str(sock), "--vllm-python", python, "--vllm-arg=--enforce-eager",
                           "--vllm-arg=--max-model-len=256", "--json",
                           env={**env, **({"HOTWEIGHTS_VLLM_STANDBY": "off"} if mode == "plain" else {})})
                took = time.monotonic() - began
                if done.returncode != 0:
                    raise SystemExit(f"{mode}: the preload failed: {done.stderr[-2000:]}")
                log = (sock / f"vllm-preload-{model.name}.log").read_text()
                used = bool(evidence.STANDBY_USED_RE.search(log))
                if used != (mode == "standby"):
                    raise SystemExit(f"{mode}: the standby was {'used' if used else 'not used'}: {log[-2000:]}")
                runs[mode].append(round(took, 2))
                print(f"{mode}: {took:.2f} s", file=sys.stderr)
    finally:
        cli("stop", "--socket-dir", str(sock))
        subprocess.run([python, "-m", "hotweights", "standby", "--stop", "--socket-dir", str(sock)],
                       capture_output=True, timeout=60)
    medians = {mode: statistics.median(xs) for mode, xs in runs.items()}
    result = {"what": "hotweights preload --engine vllm of the CPU demo model (vLLM CPU build), its entry released "
                      "between runs; plain: HOTWEIGHTS_VLLM_STANDBY=off; standby: the loader run in a ready standby",
              "python": python, "size": args.size, "rounds": args.rounds, "runs_s": runs, "median_s": medians,
              "standby_over_plain": round(medians["standby"] / medians["plain"], 3)}
    print(json.dumps(result, indent=1) if args.json else
          f"plain {medians['plain']:.2f} s, from a standby {medians['standby']:.2f} s "
          f"({result['standby_over_plain']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
