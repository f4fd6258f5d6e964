#!/usr/bin/env python3
"""What the cluster adds to a request: a one-node Ray Serve (``hotweights.cluster``, a local Ray) in front of one
``hotweights switch`` front, and the same requests to that front direct, interleaved: streamed completions of the
default model, its time to first token through Ray and direct (medians, p99, their difference), and whether the
stream arrives token by token through Ray (events per stream and the gaps between them, against direct).

Run: .venv/bin/python benchmarks/cluster_overhead.py --json                                    (CPU: a tiny model)
     python3 benchmarks/cluster_overhead.py --model DIR --engine vllm \\
         --engine-args "--max-model-len 2048 --gpu-memory-utilization 0.5" --json              (one GPU)
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from hotweights.observe import free_port


EXTRA: dict = {}  # vLLM: ignore_eos, so that every stream has max_tokens events


def stream_once(client: httpx.Client, url: str, model: str, max_tokens: int) -> dict:
    """One streamed completion: seconds to its first event with text, the events' arrival times after it."""
    body = {"model": model, "prompt": "The weight cache keeps", "max_tokens": max_tokens, "temperature": 0,
            "stream": True, **EXTRA}
    sent = time.perf_counter()
    arrivals: list[float] = []
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if event.get("choices") and event["choices"][0].get("text"):
                    arrivals.append(time.perf_counter() - sent)
    return {"ttft_s": arrivals[0] if arrivals else None, "events": len(arrivals),
            "gaps_s": [b - a for a, b in zip(arrivals, arrivals[1:])]}


def figures(runs: list[dict]) -> dict:
    ttfts = sorted(r["ttft_s"] for r in runs if r["ttft_s"] is not None)
    gaps = [g for r in runs for g in r["gaps_s"]]
    return {"n": len(runs), "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 2),
            "ttft_p99_ms": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] * 1000, 2),
            "events_per_stream_p50": statistics.median(r["events"] for r in runs),
            "gap_p50_ms": round(statistics.median(gaps) * 1000, 2) if gaps else None,
            "gap_max_ms": round(max(gaps) * 1000, 2) if gaps else None}


def main() -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint (default: a tiny demo model)")
    parser.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"])
    parser.add_argument("--engine-args", default="--max-model-len 128")
    parser.add_argument("--n", type=int, default=50, help="streams through each path")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-cpus", type=int, default=2, help="the local Ray's")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-overhead-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.engine == "vllm":
        EXTRA["ignore_eos"] = True
    model = args.model
    if model is None:
        from hotweights.demo_model import write_demo_model

        model = write_demo_model(out / "m0", "tiny")
    import tomli_w

    socket_root = tempfile.mkdtemp(prefix="hwo", dir="/tmp")
    config = out / "cluster.toml"
    config.write_text(tomli_w.dumps({"cluster": {"socket_root": socket_root, "start_timeout_s": 1800},
                                     "model": [{"name": "m0", "checkpoint": str(model), "engine": args.engine,
                                                "args": shlex.split(args.engine_args)}]}))
    import ray
    from ray import serve

    from hotweights.cluster.app import build

    began = time.monotonic()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(config), name="hw", route_prefix="/")
    ready_s = time.monotonic() - began
    ray_url = f"http://127.0.0.1:{port}"
    toml = max(Path(tempfile.gettempdir()).glob("hotweights-node-*/switch.toml"), key=lambda p: p.stat().st_mtime)
    import tomllib

    direct_url = f"http://127.0.0.1:{tomllib.loads(toml.read_text())['switch']['port']}"
    through, direct = [], []
    try:
        with httpx.Client(timeout=300) as c:
            for _ in range(3):  # warm both paths
                stream_once(c, ray_url, "m0", args.max_tokens)
                stream_once(c, direct_url, "m0", args.max_tokens)
            for _ in range(args.n):
                through.append(stream_once(c, ray_url, "m0", args.max_tokens))
                direct.append(stream_once(c, direct_url, "m0", args.max_tokens))
    finally:
        serve.shutdown()
        ray.shutdown()
        import subprocess

        for sock in Path(socket_root).glob("*"):
            subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", str(sock)],
                           capture_output=True)
    t, d = figures(through), figures(direct)
    result = {"command": "benchmarks/cluster_overhead.py " + " ".join(sys.argv[1:]), "engine": args.engine,
              "engine_args": args.engine_args, "max_tokens": args.max_tokens, "deployed_in_s": round(ready_s, 1),
              "through_ray": t, "direct": d, "added_ttft_p50_ms": round(t["ttft_p50_ms"] - d["ttft_p50_ms"], 2),
              "token_by_token": t["events_per_stream_p50"] == d["events_per_stream_p50"]}
    (out / "cluster_overhead.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
