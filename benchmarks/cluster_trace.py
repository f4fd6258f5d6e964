#!/usr/bin/env python3
"""The cluster (``hotweights.cluster``) under one traffic trace, side by side in one run: the same seeded trace of
several models through each of

- ``direct``: one node, direct: one ``hotweights switch`` front with every model (no Ray);
- ``warmth``: three simulated nodes (a real Ray cluster of three raylets on this machine, each node its own keeper
  and front) behind our router, which ranks nodes by each model's warmth there;
- ``multiplex``: the same nodes behind Ray Serve's default router with multiplexed model ids (a replica counts as
  holding the models it served last, as many as its front's awake places: Ray's LRU of "loaded" models);
- ``round_robin``: the same nodes in Ray's round robin.

Each node has fewer awake places than models (``max_awake``) and idle timers (``park_after_s``, ``stop_after_s``),
and each model is kept ready on ``--ready-nodes`` of the nodes, so that a model is awake on one node, parked on
another and stopped on a third. Every cluster mode starts from fresh fronts over keepers that already hold the
weights (a first, untimed deployment fills them); the modes run one after another, ``--repeats`` times, interleaved.

Per mode: goodput and SLO attainment (TTFT within ``--slo-s``), TTFT p50/p99, each node's switches by source
(``kept``: a wake of a parked engine; ``host``/``gpu``: a deep park's; ``start``/``restart``: an engine started;
``disk``) and the costly ones (starts and wakes from host memory), requests that crossed models (must be 0), the
share of requests that landed on a node where their model was awake wherever one was (from each node's status,
sampled every 0.25 s), and requests lost. Then the router's added latency: one-token requests for an awake model,
interleaved, through Ray Serve and to that node's front direct (``--latency-n`` each): medians and their
difference. Ratios: ours over Ray's default and over round robin.

Run: .venv/bin/python benchmarks/cluster_trace.py --json --out /tmp/hw-cluster     (CPU, about 15 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster_nodes import RayNodes, write_config
from switch_mix import start_front, write_models
from switch_trace import make_trace, percentile, send, summarize

from hotweights.observe import free_port

NODE = "x-hotweights-node"
COSTLY = ("start", "restart", "host", "disk")  # the first two counted by pid (``starts``), the others by switch


def front_switches(url: str) -> dict[str, float]:
    """A front's switches by source (its ``/metrics``)."""
    out: dict[str, float] = {}
    with httpx.Client(timeout=10) as c:
        for line in c.get(f"{url}/metrics").text.splitlines():
            if line.startswith("hotweights_switch_switches_total{"):
                source = line.split('source="', 1)[1].split('"', 1)[0]
                out[source] = out.get(source, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def sample_states(get: callable, stop: threading.Event, samples: list[tuple[float, dict]]) -> None:
    """Every 0.25 s: each node's model states and engine pids ({node: {model: (state, pid)}}), with the time."""
    while not stop.is_set():
        try:
            samples.append((time.monotonic(), get()))
        except (OSError, ValueError, KeyError, httpx.HTTPError):  # a front between two answers: the next sample
            pass
        stop.wait(0.25)


def starts(samples: list[tuple[float, dict]]) -> dict[str, int]:
    """Engine starts per node during the trace: each (model, pid) seen that the first sample did not have (a front
    counts a start for a request apart from its switches)."""
    if not samples:
        return {}
    seen = {n: {(m, pid) for m, (_s, pid) in models.items() if pid} for n, models in samples[0][1].items()}
    first = {n: set(v) for n, v in seen.items()}
    for _at, nodes in samples[1:]:
        for n, models in nodes.items():
            seen.setdefault(n, set()).update((m, pid) for m, (_s, pid) in models.items() if pid)
    return {n: len(seen[n] - first.get(n, set())) for n in seen}


def awake_hits(rows: list[dict], samples: list[tuple[float, dict]]) -> dict:
    """Of the requests whose model was awake on some node when they were sent (the last sample before), how many
    landed on a node where it was awake."""
    hits = eligible = 0
    for r in rows:
        before = [s for at, s in samples if at <= r["sent_mono"]]
        if not before or not r.get("node"):
            continue
        states = before[-1]
        awake = {n for n, models in states.items() if models.get(r["model"], ("", 0))[0] == "awake"}
        if awake:
            eligible += 1
            hits += r["node"] in awake
    return {"eligible": eligible, "landed_awake": hits, "share": round(hits / eligible, 4) if eligible else None}


class Noting:
    """What ``switch_trace.send`` uses of a client (``stream``), over the shared one: notes when the request went and
    the node that served it (the ingress's header)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client, self.node, self.sent = client, "", 0.0

    def stream(self, *args, **kwargs):
        self.sent = time.monotonic()
        ctx = self.client.stream(*args, **kwargs)
        noting = self

        class Entered:
            async def __aenter__(self):
                resp = await ctx.__aenter__()
                noting.node = resp.headers.get(NODE, "direct")[:12]
                return resp

            async def __aexit__(self, *exc):
                return await ctx.__aexit__(*exc)

        return Entered()


async def send_noting_node(client: httpx.AsyncClient, url: str, r, began: float) -> dict:
    """``switch_trace.send``, with the node that served it and when it was sent (``time.monotonic()``)."""
    noting = Noting(client)
    row = await send(noting, url, r, began)
    row["sent_mono"], row["node"] = noting.sent, noting.node
    return row


def run_trace(url: str, trace, args: argparse.Namespace, fronts: dict[str, str]) -> dict:
    before = {n: front_switches(u) for n, u in fronts.items()}
    samples: list[tuple[float, dict]] = []
    stop = threading.Event()

    def states() -> dict:
        out = {}
        for n, u in fronts.items():
            with httpx.Client(timeout=2) as c:
                out[n] = {m["name"]: (m["state"], m["pid"]) for m in c.get(f"{u}/switch/status").json()["models"]}
        return out

    sampler = threading.Thread(target=sample_states, args=(states, stop, samples), daemon=True)
    sampler.start()

    async def everything() -> list[dict]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.request_timeout_s, connect=30), limits=limits) as c:
            began = time.perf_counter()
            return list(await asyncio.gather(*(send_noting_node(c, url, r, began) for r in trace)))

    try:
        rows = asyncio.run(everything())
    finally:
        stop.set()
        sampler.join()
    after = {n: front_switches(u) for n, u in fronts.items()}
    per_node = {n: {s: after[n].get(s, 0) - before[n].get(s, 0) for s in after[n]
                    if after[n].get(s, 0) - before[n].get(s, 0)} for n in fronts}
    started = starts(samples)
    costly = sum(started.values()) + sum(v for sw in per_node.values() for s, v in sw.items() if s in COSTLY[2:])
    summary = summarize(rows, args, {"switches_by_node": per_node, "starts_by_node": started, "costly_moves": costly,
                                     "switches": sum(v for sw in per_node.values() for v in sw.values()),
                                     "landed_awake": awake_hits(rows, samples),
                                     "requests_by_node": {n: sum(r["node"] == n for r in rows) for n in fronts},
                                     "lost": sum(r["outcome"] not in ("ok", "crossed") for r in rows)})
    summary["rows"] = [{k: v for k, v in r.items() if k != "sent_mono"} for r in summary["rows"]]
    return summary


def latency(ray_url: str, fronts: dict[str, str], n: int) -> dict:
    """One-token requests for the default model (awake on every node), interleaved: through Ray Serve, and to the
    front of the node that served it, direct. Medians (ms) and their difference."""
    body = {"model": "m0", "prompt": "hi", "max_tokens": 1, "temperature": 0}
    through, direct = [], []
    with httpx.Client(timeout=60) as c:
        for _ in range(5):  # warm both paths
            node = c.post(f"{ray_url}/v1/completions", json=body).headers.get(NODE, "")[:12]
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(f"{ray_url}/v1/completions", json=body)
            through.append(time.perf_counter() - t)
            node = r.headers.get(NODE, "")[:12] or node
            t = time.perf_counter()
            c.post(f"{fronts[node]}/v1/completions", json=body)
            direct.append(time.perf_counter() - t)
    p50 = statistics.median
    return {"n": n, "through_ray_p50_ms": round(p50(through) * 1000, 2), "direct_p50_ms": round(p50(direct) * 1000, 2),
            "added_p50_ms": round((p50(through) - p50(direct)) * 1000, 2),
            "through_ray_p99_ms": round(percentile(through, 99) * 1000, 2),
            "direct_p99_ms": round(percentile(direct, 99) * 1000, 2)}


def model_keys(names: list[str], args: argparse.Namespace) -> dict[str, dict]:
    return {n: {"park_after_s": args.park_after_s, "stop_after_s": args.stop_after_s} for n in names[1:]}


def main() -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--max-awake", type=int, default=2, help="each node's awake places")
    parser.add_argument("--ready-nodes", type=int, default=2)
    parser.add_argument("--spread-at", type=int, default=8)
    parser.add_argument("--park-after-s", type=float, default=10.0)
    parser.add_argument("--stop-after-s", type=float, default=30.0)
    parser.add_argument("--modes", default="direct,warmth,multiplex,round_robin")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=3.0, help="requests/s in all, Zipf over the models")
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--burst-every-s", type=float, default=20.0)
    parser.add_argument("--burst-size", type=int, default=4)
    parser.add_argument("--prompt-tokens", default="8,32")
    parser.add_argument("--max-tokens", default="4,24")
    parser.add_argument("--probe-every", type=int, default=5)
    parser.add_argument("--slo-s", type=float, default=2.0)
    parser.add_argument("--tpot-slo-s", type=float, default=0.5)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument("--latency-n", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.per_model_rate = ""
    args.prompt_range = tuple(int(x) for x in args.prompt_tokens.split(","))
    args.max_tokens_range = tuple(int(x) for x in args.max_tokens.split(","))
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-cluster-"))
    out.mkdir(parents=True, exist_ok=True)
    names = [f"m{i}" for i in range(args.models)]
    models = write_models(out / "models", ["tiny"] * args.models, "cpu")
    socket_root = tempfile.mkdtemp(prefix="hwb", dir="/tmp")
    switch = {"max_awake": args.max_awake, "request_timeout_s": args.request_timeout_s}
    config = write_config(out / "cluster.toml", models, switch=switch, model_keys=model_keys(names, args),
                          cluster={"socket_root": socket_root, "ready_nodes": args.ready_nodes,
                                   "spread_at": args.spread_at, "stats_period_s": 1.0})
    modes = args.modes.split(",")
    result: dict = {"command": "benchmarks/cluster_trace.py " + " ".join(sys.argv[1:]), "modes": modes,
                    "trace_requests": len(make_trace(names, args, args.rate, args.seed)),
                    "runs": {m: [] for m in modes}}
    ray_nodes = RayNodes(args.nodes, config)
    try:
        ray_nodes.wait_fronts(args.nodes)  # the first deployment fills the keepers (untimed)
        for rep in range(args.repeats):
            trace = make_trace(names, args, args.rate, args.seed + rep)
            for mode in modes:
                if mode == "direct":
                    result["runs"][mode].append(run_direct(config, models, trace, args, out, rep))
                else:
                    ray_nodes.serve.delete("hw")
                    ray_nodes.wait_fronts(0, gone=True)  # the last mode's fronts stopped before the new ones start
                    ray_nodes.deploy(router=mode)
                    fronts = ray_nodes.wait_fronts(args.nodes)
                    time.sleep(3.0)  # three stats periods: the routers have every node's report
                    run = run_trace(ray_nodes.url, trace, args, fronts)
                    if mode == "warmth" and rep == 0:
                        result["router_latency"] = latency(ray_nodes.url, fronts, args.latency_n)
                    result["runs"][mode].append(run)
                print(json.dumps({mode: {k: v for k, v in result["runs"][mode][-1].items() if k != "rows"}}),
                      file=sys.stderr, flush=True)
                (out / "partial.json").write_text(json.dumps(result))
    finally:
        ray_nodes.close()
    result["medians"] = {m: medians(runs) for m, runs in result["runs"].items()}
    result["ratios"] = ratios(result["medians"])
    result["crossed"] = sum(r["crossed"] for runs in result["runs"].values() for r in runs)
    for runs in result["runs"].values():
        for r in runs:
            r.pop("rows", None)
    (out / "cluster_trace.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 1 if result["crossed"] else 0


def run_direct(config: Path, models: dict[str, Path], trace, args: argparse.Namespace, out: Path, rep: int) -> dict:
    """One front with every model, direct (the same [switch] table and idle timers as each node's)."""
    import tomllib

    import tomli_w

    raw = tomllib.loads(config.read_text())
    raw.pop("cluster")
    port = free_port()
    raw["switch"] = {**raw["switch"], "port": port}
    direct = out / f"direct-{rep}.toml"
    direct.write_text(tomli_w.dumps(raw))
    sock = tempfile.mkdtemp(prefix="hwd", dir="/tmp")
    url = f"http://127.0.0.1:{port}"
    front, _s = start_front([sys.executable, "-m", "hotweights", "switch", "--config", str(direct)], url, sock,
                            out / f"direct-{rep}.log", "direct")
    try:
        return run_trace(url, trace, args, {"direct": url})
    finally:
        front.terminate()
        front.wait(60)
        subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)


FIGURES = ("goodput_rps", "slo_attainment", "ttft_p50_s", "ttft_p99_s", "costly_moves", "switches", "lost", "crossed")


def medians(runs: list[dict]) -> dict:
    out = {}
    for f in FIGURES:
        xs = [r[f] for r in runs if r.get(f) is not None]
        out[f] = statistics.median(xs) if xs else None
    shares = [r["landed_awake"]["share"] for r in runs if r["landed_awake"]["share"] is not None]
    out["landed_awake_share"] = statistics.median(shares) if shares else None
    return out


def ratios(m: dict) -> dict:
    def ratio(a: str, b: str, f: str) -> float | None:
        x, y = m.get(a, {}).get(f), m.get(b, {}).get(f)
        return round(x / y, 3) if x is not None and y else None

    return {"costly_moves_warmth_over_multiplex": ratio("warmth", "multiplex", "costly_moves"),
            "switches_warmth_over_round_robin": ratio("warmth", "round_robin", "switches"),
            "ttft_p99_warmth_over_multiplex": ratio("warmth", "multiplex", "ttft_p99_s"),
            "ttft_p99_warmth_over_direct": ratio("warmth", "direct", "ttft_p99_s")}


if __name__ == "__main__":
    sys.exit(main())
