#!/usr/bin/env python3
"""vLLM on the GPU, path by path: does each plugin path start, answer like a disk start,
keep the KV cache a disk start gets, and hold the weights once?

Run on the GPU machine after staging vLLM (``../shared/gpu-vllm/README.md``), in steps
that each fit one device call:

    python benchmarks/vllm_gpu_checks.py --model M --out $OUT --steps strict,preload,zero_copy,disk
    python benchmarks/vllm_gpu_checks.py --model M --out $OUT --steps two_engines,copy,stream

Steps (each a real vLLM process, its log kept as ``<step>.log``):

- ``strict``: ``{"fallback": false}`` and no daemon: seconds from process start to exit
  and the strict evidence message.
- ``preload``: ``hotweights preload --engine vllm`` (vLLM's own loader + write-through on the GPU).
- ``zero_copy`` / ``copy``: engine layout, fallback off, default ``--gpu-memory-utilization``.
- ``stream``: plain ``hotweights preload`` entry streamed into vLLM's loaders.
- ``disk``: ``--load-format auto`` (the baseline; the entry stays held, as in production).
- ``two_engines``: two zero-copy engines at once on the same entry; ``nvidia-smi`` used
  memory with the daemon only, then with both engines ready.

Prints and writes ``checks.json``: per step ready, seconds, answer, KV-cache figures,
``Model loading took``, evidence lines; per comparison whether answers and KV caches match.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from hotweights.observe import Observed, complete, free_port
from hotweights.verify.vllm_log import facts

EVIDENCE = ("hotweights", "Weight cache", "weight cache", "falling back", "KV cache", "Model loading took",
            "GPU budget", "Free memory on device", "Error", "error")


def gpu_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotweights", *args], capture_output=True, text=True)


class Session:
    def __init__(self, model: str, out: Path, socket_dir: str, extra_vllm: list[str]) -> None:
        self.model, self.out, self.socket_dir, self.extra_vllm = model, out, socket_dir, extra_vllm
        self.results: dict[str, dict] = {}

    def start(self, label: str, *args: str, extra: dict | None = None) -> Observed:
        port = free_port()
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, "--port", str(port),
               *self.extra_vllm, *args]
        if extra is not None:
            cmd += ["--load-format", "hotweights", "--model-loader-extra-config",
                    json.dumps({"socket_dir": self.socket_dir, **extra})]
        obs = Observed(label, cmd, out_dir=self.out, health_url=f"http://127.0.0.1:{port}/health")
        obs.port = port  # type: ignore[attr-defined]
        return obs

    def finish(self, obs: Observed, *, timeout_s: float = 400) -> dict:
        receipt = obs.wait_ready(timeout_s=timeout_s, interval_s=0.5)
        url = f"http://127.0.0.1:{obs.port}"  # type: ignore[attr-defined]
        answer = complete(url, "The weight cache", model=self.model) if receipt.ready else None
        result = {"ready": receipt.ready, "seconds": round(receipt.elapsed_s, 2), "answer": answer}
        return result

    def record(self, obs: Observed, result: dict) -> dict:
        obs.stop(grace_s=20)
        log = obs.log_text()
        read = facts(log)
        result.update(kv_cache_gib=read["kv_cache_gib"], kv_cache_tokens=read["kv_cache_tokens"],
                      model_loading_gib=read["model_loading_gib"], model_loading_s=read["weights_s"],
                      exit_code=obs.proc.returncode,
                      evidence=[line[-400:] for line in log.splitlines() if any(k in line for k in EVIDENCE)][:40])
        self.results[obs.label] = result
        print(json.dumps({obs.label: {k: v for k, v in result.items() if k != "evidence"}}), flush=True)
        return result

    def run(self, label: str, *args: str, extra: dict | None = None) -> dict:
        obs = self.start(label, *args, extra=extra)
        return self.record(obs, self.finish(obs))

    # -- steps ----------------------------------------------------------------------------

    def strict(self) -> None:
        obs = self.start("strict", extra={"fallback": False, "socket_dir": "/tmp/hw-no-daemon"})
        start = time.monotonic()
        code = obs.proc.wait(timeout=300)
        result = {"ready": False, "exit_code": code, "seconds_to_exit": round(time.monotonic() - start, 2),
                  "strict_message": "and fallback is disabled" in obs.log_text()}
        self.record(obs, result)

    def preload(self) -> None:
        start = time.monotonic()
        r = cli("preload", "--engine", "vllm", "--model", self.model, "--dtype", "bfloat16", "--socket-dir",
                self.socket_dir, "--json", "--log", str(self.out / "preload.log"),
                *[f"--vllm-arg={a}" for a in self.extra_vllm])
        self.results["preload"] = {"exit_code": r.returncode, "seconds": round(time.monotonic() - start, 1),
                                   "stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}
        print(json.dumps({"preload": self.results["preload"]}), flush=True)

    def zero_copy(self) -> None:
        self.run("zero_copy", extra={"fallback": False, "layout": "engine"})

    def copy(self) -> None:
        self.run("copy", extra={"fallback": False, "layout": "engine", "mode": "copy"})

    def stream(self) -> None:
        r = cli("preload", "--model", self.model, "--dtype", "bfloat16", "--device", "cuda", "--socket-dir",
                self.socket_dir, "--json")
        self.results["stream_preload"] = {"exit_code": r.returncode, "stdout": r.stdout[-1000:],
                                          "stderr": r.stderr[-1000:]}
        self.run("stream", extra={"fallback": False, "layout": "checkpoint"})

    def disk(self) -> None:
        self.results["disk_cache_held_mib"] = gpu_used_mib()
        self.run("disk", "--load-format", "auto")

    def two_engines(self) -> None:
        daemon_only = gpu_used_mib()
        extra = {"fallback": False, "layout": "engine"}
        first = self.start("engine_a", "--gpu-memory-utilization", "0.4", extra=extra)
        a = self.finish(first)
        second = self.start("engine_b", "--gpu-memory-utilization", "0.4", extra=extra)
        b = self.finish(second)
        both = gpu_used_mib()
        self.record(first, a)
        self.record(second, b)
        self.results["two_engines"] = {"daemon_only_mib": daemon_only, "both_ready_mib": both}
        print(json.dumps({"two_engines": self.results["two_engines"]}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--socket-dir", default="/tmp/hw-gpu")
    parser.add_argument("--steps", default="strict,preload,zero_copy,disk")
    parser.add_argument("--vllm-arg", action="append", default=[])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    session = Session(args.model, args.out, args.socket_dir, args.vllm_arg)
    path = args.out / "checks.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    for step in args.steps.split(","):
        getattr(session, step)()
        path.write_text(json.dumps({**previous, **session.results}, indent=1))  # kept if a later step hangs
    return 0


if __name__ == "__main__":
    sys.exit(main())
