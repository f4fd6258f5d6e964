#!/usr/bin/env python3
"""A paused stream's way back, measured side by side on one embedded server (issue 69): a park that keeps the
generation and its KV cache (``POST /sleep?level=2&mode=keep``, what ``hotweights switch --preempt`` does with the
embedded engine) against today's recompute (the stream cut, a plain level-2 park, and on the wake a continuation:
a completion of the prompt's token ids and those generated so far, what the switch does with vLLM).

Per round, each way in turn (interleaved): a streamed greedy completion of a ``--prompt-tokens`` prompt (random
token ids), paused after ``--pause-after`` tokens; the park; ``--parked-s`` parked; the wake; then the time from the
wake's return to the next token (keep: the generation goes on; recompute: the continuation's first token, after
its prefill of the prompt and the answer so far). Also each answer's token ids against the first unpaused one's
(greedy), and the same request unpaused each round (``plain``: how far two runs agree with no pause at all).
Prints the medians, and the ratio of the ways back.

Run: .venv/bin/python benchmarks/kv_keep.py --size small --json                             (CPU)
     python3 benchmarks/kv_keep.py --size 8b --device cuda --prompt-tokens 2000 --json       (a GPU)
     python3 benchmarks/kv_keep.py --engine vllm --size 0.6b --device cuda --json            (a GPU, vLLM 0.26)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ports import free_port


def events(resp: httpx.Response):
    for line in resp.iter_lines():
        if line.startswith("data: {"):
            yield json.loads(line[6:])


def body(prompt: list[int], max_tokens: int, stream: bool = True) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream,
            "return_token_ids": True}


def ids_of(event: dict) -> list[int]:
    return [t for c in event.get("choices") or [] for t in (c.get("token_ids") or [])]


def keep_round(c: httpx.Client, url: str, prompt: list[int], args: argparse.Namespace) -> dict:
    """A reader thread notes each event's arrival: the tokens the engine made between ``--pause-after`` and the
    moment its gate closed arrive while parked, and do not count as the way back."""
    import threading

    got: list[tuple[float, list[int]]] = []
    enough = threading.Event()

    def read() -> None:
        with c.stream("POST", f"{url}/v1/completions", json=body(prompt, args.max_tokens)) as r:
            for event in events(r):
                got.append((time.perf_counter(), ids_of(event)))
                if sum(len(ids) for _t, ids in got) >= args.pause_after:
                    enough.set()
        enough.set()

    reader = threading.Thread(target=read)
    reader.start()
    enough.wait(600)
    park_s, wake_s, woke = park_and_wake(c, url, True, args)
    reader.join(600)
    after = [at for at, ids in got if ids and at > woke]
    return {"park_s": park_s, "wake_s": wake_s, "resume_s": after[0] - woke if after else None,
            "ids": [i for _t, ids in got for i in ids]}


def park_and_wake(c: httpx.Client, url: str, keep: bool, args: argparse.Namespace) -> tuple[float, float, float]:
    """A level-2 park, ``--parked-s`` parked, the wake: the park's and the wake's seconds, and when the wake returned
    (``time.perf_counter()``). ``keep``: the generation kept with its KV cache (the embedded server's
    ``mode=keep``; vLLM's scheduler paused with its requests kept, then the weights alone unmapped by
    ``hotweights_hold``); else a plain park (vLLM's sleep drops the KV cache)."""
    vllm_keep = keep and args.engine == "vllm"
    t = time.perf_counter()
    if vllm_keep:
        c.post(f"{url}/pause?mode=keep").raise_for_status()
        c.post(f"{url}/collective_rpc", json={"method": "hotweights_hold", "args": ["2"]}).raise_for_status()
    else:
        c.post(f"{url}/sleep?level=2" + ("&mode=keep" if keep else "")).raise_for_status()
    park_s = time.perf_counter() - t
    time.sleep(args.parked_s)
    t = time.perf_counter()
    if vllm_keep:
        c.post(f"{url}/collective_rpc", json={"method": "hotweights_release"}).raise_for_status()
        c.post(f"{url}/resume").raise_for_status()
    else:
        c.post(f"{url}/wake_up").raise_for_status()
    woke = time.perf_counter()
    return park_s, woke - t, woke


def recompute_round(c: httpx.Client, url: str, prompt: list[int], args: argparse.Namespace) -> dict:
    out: list[int] = []
    with c.stream("POST", f"{url}/v1/completions", json=body(prompt, args.max_tokens)) as r:
        it = events(r)
        while len(out) < args.pause_after:
            out += ids_of(next(it))
    # the stream is cut (the engine cancels the job within a step): a plain park waits for it
    park_s, wake_s, woke = park_and_wake(c, url, False, args)
    resume_s = None
    with c.stream("POST", f"{url}/v1/completions", json=body(prompt + out, args.max_tokens - len(out))) as r:
        for event in events(r):
            got = ids_of(event)
            if got and resume_s is None:
                resume_s = time.perf_counter() - woke
            out += got
    return {"park_s": park_s, "wake_s": wake_s, "resume_s": resume_s, "ids": out}


def start(args: argparse.Namespace, work: Path, env: dict[str, str]) -> tuple[str, subprocess.Popen, str, Path]:
    """The model (a demo model unless ``--model``), preloaded, and its server starting: its path, process, URL and
    log."""
    hw = [sys.executable, "-m", "hotweights"]
    model = args.model or str(work / "model")
    if not args.model:
        gen = ["--gen-device", "cuda"] if args.device.startswith("cuda") else []
        subprocess.run([*hw, "demo-model", model, "--size", args.size, *gen], check=True, env=env, stdout=sys.stderr)
    port = free_port()
    log = work / "serve.log"
    length = str(args.prompt_tokens + args.max_tokens + 8)
    extra = json.dumps({"fallback": False})
    if args.engine == "vllm":  # the engine layout, zero-copy; sleep mode and the dev endpoints (/pause, RPC)
        subprocess.run([*hw, "preload", "--engine", "vllm", "--model", model], check=True, env=env, stdout=sys.stderr)
        cmd = [*hw, "vllm", "serve", model, "--port", str(port), "--max-model-len", length, "--load-format",
               "hotweights", "--model-loader-extra-config", extra, "--enable-sleep-mode", *args.vllm_args.split()]
        env = {**env, "VLLM_SERVER_DEV_MODE": "1"}
    else:
        subprocess.run([*hw, "preload", "--model", model, "--device", args.device], check=True, env=env,
                       stdout=sys.stderr)
        cmd = [*hw, "serve", model, "--port", str(port), "--device", args.device, "--max-model-len", length,
               "--model-loader-extra-config", extra]
    server = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
    return model, server, f"http://127.0.0.1:{port}", log


def summarize(result: dict) -> None:
    """Per way its medians (``back_s``: from asking the wake to the next token) and their ratio."""
    med = {}
    for name in ("keep", "recompute", "plain"):
        rows = [r for r in result["rounds"] if r["way"] == name]
        med[name] = {"same_as_unpaused": sum(r["same_as_unpaused"] for r in rows),
                     "agree_tokens": sorted(r["agree_tokens"] for r in rows)}
        if name == "plain":
            continue
        med[name].update({k: round(statistics.median(r[k] for r in rows if r[k] is not None), 4)
                          for k in ("park_s", "wake_s", "resume_s")})
        med[name]["back_s"] = round(med[name]["wake_s"] + med[name]["resume_s"], 4)
    result["medians"] = med
    result["recompute_over_keep"] = round(med["recompute"]["back_s"] / med["keep"]["back_s"], 2)


def plain_round(c: httpx.Client, url: str, prompt: list[int], args: argparse.Namespace) -> dict:
    """The same request unpaused: how far two runs of it agree here (a demo model's logits are nearly flat, and on a
    GPU two runs' numerics may part a greedy answer with no pause at all)."""
    out: list[int] = []
    with c.stream("POST", f"{url}/v1/completions", json=body(prompt, args.max_tokens)) as r:
        for event in events(r):
            out += ids_of(event)
    return {"park_s": None, "wake_s": None, "resume_s": None, "ids": out}


def agree(a: list[int], b: list[int]) -> int:
    """How many tokens two answers share from their start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", help="demo model size (hotweights demo-model --size)")
    parser.add_argument("--model", default="", help="a checkpoint instead of a demo model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engine", choices=["hotweights", "vllm"], default="hotweights",
                        help="vllm: hotweights vllm serve on a GPU (its KV-keeping park: /pause?mode=keep, then "
                             "hotweights_hold over /collective_rpc)")
    parser.add_argument("--vllm-args", default="--gpu-memory-utilization 0.5", help="vllm: more server arguments")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--pause-after", type=int, default=32)
    parser.add_argument("--parked-s", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def main() -> int:
    args = parse()
    work = Path(tempfile.mkdtemp(prefix="hw-kvkeep-"))
    sock = tempfile.mkdtemp(prefix="hwkv", dir="/tmp")
    env = {**os.environ, "HOTWEIGHTS_SOCKET_DIR": sock}
    hw = [sys.executable, "-m", "hotweights"]
    model, server, url, log = start(args, work, env)
    result: dict = {"command": "benchmarks/kv_keep.py " + " ".join(sys.argv[1:]), "rounds": []}
    try:
        with httpx.Client(timeout=600) as c:
            deadline = time.monotonic() + 900
            while True:
                try:
                    if c.get(f"{url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(log.read_text()[-3000:])
                time.sleep(0.5)
            vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
            prompt = [random.Random(args.seed + i).randrange(300, min(vocab, 30000)) for i in range(args.prompt_tokens)]
            plain: list[int] = []
            with c.stream("POST", f"{url}/v1/completions", json=body(prompt, args.max_tokens)) as r:
                for event in events(r):
                    plain += ids_of(event)
            for i in range(args.rounds):
                ways = [("keep", keep_round), ("recompute", recompute_round), ("plain", plain_round)]
                for name, way in ways if i % 2 == 0 else ways[::-1]:
                    row = way(c, url, prompt, args)
                    row["same_as_unpaused"], row["agree_tokens"] = row["ids"] == plain, agree(row.pop("ids"), plain)
                    result["rounds"].append({"way": name, **{k: round(v, 4) if isinstance(v, float) else v
                                                              for k, v in row.items()}})
                    print(json.dumps(result["rounds"][-1]), file=sys.stderr, flush=True)
            metrics = c.get(f"{url}/metrics").text
    finally:
        server.terminate()
        server.wait(60)
        subprocess.run([*hw, "stop", "--socket-dir", sock], capture_output=True)
    result["prompt_tokens_counted"] = sum(float(x.rsplit(" ", 1)[1]) for x in metrics.splitlines()
                                          if x.startswith(("hotweights_server_prompt_tokens_total",
                                                           "vllm:prompt_tokens_total")))
    result["server_log_tail"] = [x for x in log.read_text(errors="replace").splitlines()
                                 if "Parked" in x or "Woke" in x or "hotweights" in x][-12:]
    summarize(result)
    result["settings"] = {k: v for k, v in vars(args).items() if k != "json"}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
