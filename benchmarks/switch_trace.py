#!/usr/bin/env python3
"""``hotweights switch`` under a traffic trace: many models at once, bursts, long prompts, streams overlapping
switches; every mode side by side in one run, against the same seeded trace.

The trace (``--seed``): Poisson arrivals at each rate of ``--rates`` (requests/s in all), each for a model drawn by
Zipf-like popularity (weight 1/(rank+1)^``--zipf-s``: a popular model and a long tail), or with
``--per-model-rate R[,R...]`` a Poisson process of R requests/s per model, a sweep over the Rs (as Aegaeon's SOSP'25
evaluation: 0.1 and 0.5),
plus bursts (on average every ``--burst-every-s``, ``--burst-size`` requests for one model within half a
second); prompts of ``--prompt-tokens LO,HI`` tokens (log-uniform; token ids, so every engine sees the same length),
``--max-tokens LO,HI``, greedy, streamed. Every ``--probe-every``-th request of a model is its probe prompt: its
answer must begin as that model's first probe answer did (the same first token, its logprob within
``PROBE_TOLERANCE``), and every chunk must name the model asked for: a request answered by another model's engine
counts in ``crossed`` and fails the run (exit 1).
``probe_tells_models_apart``: no two models' probe answers begin alike, so that the probe could tell them apart.

Per request: time to first token (TTFT, from sending), time per output token after the first (TPOT: the stream's
time after its first token over the tokens after it, the tokens from the stream's usage event, as an engine may
merge several into one event), outcome. Per run: p50/p95/p99 TTFT over every request (one that failed counts as
never: its TTFT is infinite, shown as null), p50/p99 TPOT, goodput (requests answered with a first token within
``--slo-s``, per second of trace), SLO attainment (the share of requests with TTFT within ``--slo-s`` and TPOT
within ``--tpot-slo-s``), switches (the front's counter), GPU and host memory sampled every second, and where the
run's time went (``turns``, from the front's and vLLM engines' logs over the run: ``switch_turns.py``). Each rate runs
``--repeats`` times (seeds ``--seed``, +1, ...) on the same front, one after another, the lowest rate first; per
rate the medians of the runs with their spread (min, max). Modes, each a front of its own (``hotweights switch
--config``), one keeper for all:

- ``park``: the front's defaults: every engine that fits stays awake (``max_awake = "auto"``: GPU memory bounds
  the awake set), parked engines keep their weights on the GPU, ``schedule = "fair"``, bounded turns where memory
  forces a choice between busy engines (``turn_s``);
- ``one``: the same, capped at one engine awake (``max_awake = 1``): every model change is a switch;
- ``before``: today's policy of 2026-12-03 (one engine awake, a 2 s wait behind a busy engine, then its model wakes
  beside it and the busy engine refuses its own requests until it parks), run from the source tree that
  ``--before-src`` names (``git worktree add /tmp/hw-before 34b815a``: its ``src``); fronts and engines of that
  code;
- ``park_fifo``: first come, first served;
- ``park_x2``: ``max_awake = 2`` (two engines awake at once where memory allows);
- ``park_host``: every parked engine's weights in host memory; ``mixed``: the most popular half (``--gpu-tier K``:
  the K most popular) on the GPU, the rest in host memory;
- ``preempt``, ``one_preempt``, ``mixed_preempt``: ``park``, ``one`` and ``mixed`` with ``preempt = true`` (a busy
  engine whose turn is over pauses its streams at once; each continues on its next wake: ``switch/preempt.py``);
  a ``_nokv`` suffix (``one_preempt_nokv``) with ``keep_kv = false`` (a paused stream continues by a new request:
  its prompt computed again, as before issue 69), a ``_kvhost`` suffix with ``held_kv = "host"`` (a held vLLM
  park moves the KV cache to pinned host memory), a ``_deadline`` suffix (``mixed_preempt_deadline``) with
  ``schedule = "deadline"`` (issue 69; after ``_nokv`` and ``_kvhost`` where both), a ``_traffic`` suffix (last)
  with ``tiers = "traffic"`` (issue 69, part 3: ``--tier-window-s``) and the GPU tier given to the *least* popular
  models at the start, so that traffic has them to move; an ``_awake1`` or ``_awake2`` suffix (after all others)
  with ``max_awake`` 1 or 2, whatever memory allows: the GPU's time taken in turns too (an H100 run of five 8B
  showed the GPU-tier engines awake beside a host-tier one taking most of the GPU's time: Aegaeon runs one model
  at a time per GPU);
- ``vllm_sleep`` (vLLM only): engines read the checkpoint themselves and park with vLLM's own sleep;
- ``restart``: ``--no-parking`` (stop one engine, start the next: llama-swap's way);
- ``static``: every model awake at once (``max_awake = N``): static partitioning, what a user does without a
  switch, where the engines fit beside each other (each with the engine arguments given: on a GPU pass
  ``--gpu-memory-utilization`` of about 1/N).

Each mode also reads what every tier holds when its front is up and after the trace (``memory_by_tier``: the
keeper's entries per tier and its process, each engine's processes on the GPU and in host RSS, the totals), and
then asks every model once (``roll_call``: a Zipf trace may never ask the last model of its long tail).

``--url URL --names a,b,c`` runs the trace once against a front that runs already (mode ``given``).

Run: .venv/bin/python benchmarks/switch_trace.py --json                                       (CPU: 3 tiny models)
     .venv/bin/python benchmarks/switch_trace.py --modes park,before,static --before-src /tmp/hw-before/src \\
         --rates 2,4 --repeats 3 --duration-s 30 --max-tokens 32,512 --json                      (CPU: the sweep)
     python3 benchmarks/switch_trace.py --size 8b --gen-device cuda --engine vllm --rates 2,6,16 \\
         --max-tokens 32,512 --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.25" \\
         --modes park,before,static --before-src DIR --json                                      (an H200)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from switch_mix import model_table, start_front, status, write_models
from switch_turns import STAMP, turns
from vllm_sleep import gpu_used_mib, host_used_mib

from hotweights.observe import free_port
from hotweights.unix import descendants
from hotweights.verify.memory import proc_status

PROBE_TOLERANCE = 0.05  # of a first token's logprob
SUFFIXES = ("_awake1", "_awake2", "_traffic", "_deadline", "_kvhost", "_nokv")  # written in the reverse order:
# mixed_preempt_kvhost_deadline_awake1
MODES = ("park", "one", "before", "park_fifo", "park_x2", "park_host", "mixed", "vllm_sleep", "restart", "static",
         "preempt", "one_preempt", "mixed_preempt")


@dataclass(frozen=True)
class Request:
    at_s: float  # from the start of the trace
    model: str
    prompt: list[int]
    max_tokens: int
    probe: bool


def at_rate(args: argparse.Namespace, rate: float) -> argparse.Namespace:
    """``args`` for the runs at ``rate``: its own ``duration_s`` (``--duration-s``, one per rate or one for all)."""
    return argparse.Namespace(**{**vars(args), "duration_s": args.duration_of[rate]})


def make_trace(names: list[str], args: argparse.Namespace, rate: float, seed: int) -> list[Request]:
    """``rate`` requests/s in all over Zipf-weighted models (with ``--per-model-rate``: each), seeded by ``seed``."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** args.zipf_s for i in range(len(names))]
    lo, hi = args.prompt_range
    probe_prompt = [rng.randrange(32, 256) for _ in range(lo)]  # byte tokens of the demo tokenizer

    def request(at: float, model: str) -> Request:
        n = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        return Request(round(at, 4), model, [rng.randrange(32, 256) for _ in range(n)],
                       rng.randint(*args.max_tokens_range), False)

    arrivals: list[Request] = []
    for model in names if args.per_model_rate else [""]:  # one Poisson process per model, or one for all
        at = rng.expovariate(rate)
        while at < args.duration_s:
            arrivals.append(request(at, model or rng.choices(names, weights)[0]))
            at += rng.expovariate(rate)
    at = rng.expovariate(1 / args.burst_every_s) if args.burst_size else args.duration_s
    while at < args.duration_s:
        model = rng.choices(names, weights)[0]
        arrivals += [request(at + rng.uniform(0, 0.5), model) for _ in range(args.burst_size)]
        at += rng.expovariate(1 / args.burst_every_s)
    arrivals.sort(key=lambda r: r.at_s)
    seen: dict[str, int] = {}
    out = []
    for r in arrivals:  # every probe_every-th request of a model (its first included) is its probe
        seen[r.model] = seen.get(r.model, 0) + 1
        probe = (seen[r.model] - 1) % args.probe_every == 0
        out.append(Request(r.at_s, r.model, probe_prompt, 8, True) if probe else r)
    return out


async def sse_events(resp: httpx.Response) -> AsyncIterator[dict]:
    """The JSON events of a server-sent event stream. Its lines end at "\\n" alone (the SSE format), not where
    ``aiter_lines`` ends them (str.splitlines: at \\x1c, \\x85, \\u2028 too, which a demo model's byte tokens
    put in an event's text: on an H200 such a split event stopped a whole trace)."""
    pending = ""
    async for chunk in resp.aiter_text():
        *lines, pending = (pending + chunk).split("\n")
        for line in lines:
            line = line.rstrip("\r")
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


async def send(client: httpx.AsyncClient, url: str, r: Request, began: float) -> dict:  # noqa: C901
    await asyncio.sleep(max(0.0, began + r.at_s - time.perf_counter()))
    body = {"model": r.model, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,  # each token's arrival (SLOS)
            **({"logprobs": 1} if r.probe else {})}
    sent = time.perf_counter()
    row = {"at_s": r.at_s, "model": r.model, "prompt_tokens": len(r.prompt), "max_tokens": r.max_tokens,
           "probe": r.probe, "ttft_s": None, "total_s": None, "tokens": 0, "chunks": 0, "outcome": "ok", "text": "",
           "logprobs": [], "first_token": None, "token_at": []}
    usage_tokens = None
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                row["outcome"] = f"http_{resp.status_code}"
                row["error"] = (await resp.aread()).decode(errors="replace")[:300]
                return row
            async for event in sse_events(resp):
                if "error" in event:
                    row["outcome"], row["error"] = "stream_error", str(event["error"])[:300]
                    break
                if event.get("model") != r.model:
                    row["outcome"] = "crossed"
                if event.get("usage"):  # the last event (include_usage): how many tokens, however chunked
                    usage_tokens = event["usage"].get("completion_tokens")
                choices = event.get("choices") or []
                if choices and row["ttft_s"] is None:
                    row["ttft_s"] = round(time.perf_counter() - sent, 4)
                for choice in choices:
                    row["chunks"] += 1  # vLLM merges tokens into one event when its client lags
                    row["token_at"] += [time.perf_counter() - sent] * max(1, len(choice.get("token_ids") or []))
                    row["text"] += choice.get("text", "")
                    logprobs = choice.get("logprobs") or {}
                    row["logprobs"] += logprobs.get("token_logprobs") or []
                    if row["first_token"] is None and logprobs.get("tokens"):
                        row["first_token"] = logprobs["tokens"][0]
    except httpx.HTTPError as exc:
        row["outcome"], row["error"] = "transport", f"{type(exc).__name__}: {exc}"[:300]
    except ValueError as exc:  # an event that is not JSON: a failure of this request, not of the run
        row["outcome"], row["error"] = "bad_event", str(exc)[:300]
    row["total_s"] = round(time.perf_counter() - sent, 4)
    row["tokens"] = usage_tokens if isinstance(usage_tokens, int) else row["chunks"]
    if not r.probe:
        row["text"] = ""
        del row["logprobs"], row["first_token"]
    return row


def sample_memory(samples: list[dict], stop: threading.Event, began: float, gpu: bool) -> None:
    while not stop.is_set():
        samples.append({"t_s": round(time.perf_counter() - began, 1), "host_used_mib": host_used_mib(),
                        **({"gpu_used_mib": gpu_used_mib()} if gpu else {})})
        stop.wait(1.0)


def rss_mib(pids: list[int], field: str = "VmRSS") -> int:
    """The sum of a /proc/PID/status field over ``pids`` (MiB; a process gone counts 0)."""
    return sum(proc_status(pid).get(field, 0) for pid in pids) >> 20


def memory_by_tier(url: str, sock: str) -> dict:
    """What each tier holds, read, not estimated: the keeper's entries by tier (its own rows) and its process
    (nvidia-smi, /proc), each model's engine processes (nvidia-smi per pid, /proc RSS of its server's tree), the
    machine's totals."""
    from hotweights.client import connect
    from hotweights.paths import daemon_paths
    from hotweights.switch.upstream.engines import gpu_mib_by_pid

    gpu = gpu_mib_by_pid()
    with connect(daemon_paths(sock)) as client:
        reply = client.status()
    rows = reply.rows()
    keeper = {"pid": reply.pid, "gpu_entries_mib": sum(r.nbytes for r in rows if r.device.startswith("cuda")) >> 20,
              "host_entries_mib": sum(r.host_nbytes + (0 if r.device.startswith("cuda") else r.nbytes)
                                      for r in rows) >> 20,
              "gpu_mib": gpu.get(reply.pid, 0), "rss_mib": rss_mib([reply.pid]),
              "rss_shmem_mib": rss_mib([reply.pid], "RssShmem")}
    engines = {}
    for m in (status(url) or {"models": []})["models"]:
        tree = [m["server_pid"], *descendants(m["server_pid"])] if m.get("server_pid") else []  # its EngineCore
        engines[m["name"]] = {"state": m["state"], "gpu_mib": sum(gpu.get(p, 0) for p in tree),
                              "rss_mib": rss_mib(tree), "rss_shmem_mib": rss_mib(tree, "RssShmem"),
                              "processes": len(tree)}  # RssShmem: the keeper's pages it maps (a host copy), no new
        # memory: a deep-parked vLLM engine's RSS grew by its host copy on the H200 while the machine's did not
    return {"keeper": keeper, "engines": engines, "gpu_used_mib": gpu_used_mib() if gpu else None,
            "host_used_mib": host_used_mib()}


def switches(url: str) -> float:
    with httpx.Client(timeout=10) as c:
        text = c.get(f"{url}/metrics").text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
               if x.startswith("hotweights_switch_switches_total"))


def percentile(xs: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) with failures as +inf; None when it is one."""
    xs = sorted(xs)
    x = xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))] if xs else math.inf
    return None if math.isinf(x) else round(x, 4)


def same_start(a: tuple[str, float], b: tuple[str, float]) -> bool:
    """Whether two probe answers (first token, its logprob) begin alike, within ``PROBE_TOLERANCE``."""
    return a[0] == b[0] and abs(a[1] - b[1]) <= PROBE_TOLERANCE


# (name, TTFT bound, per-token bound): Aegaeon's (SOSP'25) SLO, token i by the first token's time + 0.1 s x i; its
# single-GPU sweep's, with a TTFT of 5 s; ours, TTFT within 2 s and time per output token within 0.1 s. Per request.
SLOS = (("aegaeon", 10.0, 0.1), ("aegaeon_5s", 5.0, 0.1), ("ours", 2.0, 0.1))


def slo_met(r: dict, name: str, ttft_s: float, token_s: float) -> bool:
    """Whether request row ``r`` met an SLO of ``SLOS``: Aegaeon's by each token's arrival (``token_at``, seconds
    after it was sent), ours by the time per output token after the first (``tpot_s``)."""
    if r["outcome"] != "ok" or r["ttft_s"] is None or r["ttft_s"] > ttft_s:
        return False
    if name == "ours":
        return r["tpot_s"] is not None and r["tpot_s"] <= token_s
    return all(t <= r["ttft_s"] + token_s * i + 1e-3 for i, t in enumerate(r.get("token_at") or []))


def late_tokens(r: dict, pauses: int = 20) -> dict:
    """Where a request answered in time for Aegaeon's TTFT missed its per-token deadline: its first late token (index,
    seconds after it was sent, and when it was due) and its pauses (gaps between tokens over 0.1 s: the token after
    each, and the gap), the first ``pauses`` of them; nothing where it met them (the rows keep no token times)."""
    name, ttft_s, token_s = SLOS[0]
    if r["outcome"] != "ok" or r["ttft_s"] is None or r["ttft_s"] > ttft_s or slo_met(r, name, ttft_s, token_s):
        return {}
    at = r["token_at"]
    first = next(i for i, t in enumerate(at) if t > r["ttft_s"] + token_s * i + 1e-3)
    gaps = [[i, round(at[i] - at[i - 1], 3)] for i in range(1, len(at)) if at[i] - at[i - 1] > token_s]
    return {"aegaeon_late": {"token": first, "at_s": round(at[first], 3),
                             "due_s": round(r["ttft_s"] + token_s * first, 3), "pauses": gaps[:pauses]}}


def attainment(rows: list[dict], host: frozenset[str] | set[str]) -> dict:
    """Each of ``SLOS``' attainment (a share of requests), in all and per tier (``host``: the host tier's models),
    with the requests each counts."""
    def share(rs: list[dict], slo: tuple[str, float, float]) -> float | None:
        return round(sum(slo_met(r, *slo) for r in rs) / len(rs), 4) if rs else None

    tiers = {"all": rows, "gpu_tier": [r for r in rows if r["model"] not in host],
             "host_tier": [r for r in rows if r["model"] in host]}
    return {tier: {"requests": len(rs), **{slo[0]: share(rs, slo) for slo in SLOS}} for tier, rs in tiers.items()}


def summarize(rows: list[dict], args: argparse.Namespace, extra: dict,
              host: frozenset[str] | set[str] = frozenset()) -> dict:
    ttfts = [r["ttft_s"] if r["outcome"] == "ok" and r["ttft_s"] is not None else math.inf for r in rows]
    reference: dict[str, tuple[str, float]] = {}  # per model: its first probe's first token and that token's logprob
    probes = [(r, (r.get("first_token") or r["text"][:1], r["logprobs"][0])) for r in rows
              if r["probe"] and r["outcome"] == "ok" and r["text"] and r["logprobs"]]
    for r, first in probes:
        reference.setdefault(r["model"], first)
    crossed = sum(r["outcome"] == "crossed" for r in rows)
    drifted = 0
    for r, first in probes:
        # another model's engine begins as that model does: its first token, and (the demo models' may agree) its
        # logprob within the drift a batch of other requests makes. A probe that begins as no model's did drifted:
        # a demo model's logits are nearly flat (-8.1 for the top token of 152k), and in a batch of many requests
        # its greedy first token can change (on an H200 at 16 requests/s, with every engine awake: no switch)
        if not same_start(reference[r["model"]], first):
            other = any(same_start(ref, first) for name, ref in reference.items() if name != r["model"])
            crossed += other
            drifted += not other
    answers = list(reference.values())
    tells_apart = not any(same_start(a, b) for i, a in enumerate(answers) for b in answers[i + 1:])
    rates = [(r["tokens"] - 1) / (r["total_s"] - r["ttft_s"]) for r in rows if r["outcome"] == "ok" and
             r["tokens"] > 1 and r["total_s"] > r["ttft_s"]]
    for r in rows:  # time per output token after the first (0 for one token; None, counted infinite, for a failure)
        r["tpot_s"] = None
        if r["outcome"] == "ok" and r["ttft_s"] is not None:
            r["tpot_s"] = round((r["total_s"] - r["ttft_s"]) / (r["tokens"] - 1), 5) if r["tokens"] > 1 else 0.0
    tpots = [r["tpot_s"] if r["tpot_s"] is not None else math.inf for r in rows]
    met = sum(t <= args.slo_s and p <= args.tpot_slo_s for t, p in zip(ttfts, tpots))
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    return {"requests": len(rows), "outcomes": outcomes, "crossed": crossed,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
            "ttft_p99_s": percentile(ttfts, 99),
            "goodput_rps": round(sum(t <= args.slo_s for t in ttfts) / args.duration_s, 3),
            "slo_attainment": round(met / len(rows), 4) if rows else None,
            "tpot_p50_s": percentile(tpots, 50), "tpot_p99_s": percentile(tpots, 99),
            "decode_tokens_per_s_p50": round(statistics.median(rates), 1) if rates else None,
            "probe_answers": {k: [v[0][:40], round(v[1], 4)] for k, v in reference.items()},  # first token, logprob
            "probe_tells_models_apart": tells_apart, "probes_drifted": drifted, "slos": attainment(rows, host),
            **extra, "rows": [{**{k: v for k, v in r.items() if k not in ("text", "logprobs", "token_at")},
                               **late_tokens(r)} for r in rows]}


def run_trace(url: str, trace: list[Request], args: argparse.Namespace, host: frozenset[str] = frozenset()) -> dict:
    samples: list[dict] = []
    stop = threading.Event()
    began = time.perf_counter()
    sampler = threading.Thread(target=sample_memory, args=(samples, stop, began, args.gpu), daemon=True)
    sampler.start()
    before = switches(url)
    since = datetime.datetime.now()  # the front's log lines of this run (switch_turns.py)

    async def everything() -> list[dict]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.request_timeout_s, connect=30), limits=limits) as c:
            return list(await asyncio.gather(*(send(c, url, r, began) for r in trace)))

    try:
        rows = asyncio.run(everything())
    finally:
        stop.set()
        sampler.join()
    return summarize(rows, args, {"switches": switches(url) - before, "memory": samples,
                                  "wall_s": round(time.perf_counter() - began, 1),
                                  "window": [since.strftime(STAMP), datetime.datetime.now().strftime(STAMP)]}, host)


def roll_call(url: str, names: list[str], args: argparse.Namespace) -> dict:
    """After the trace, one probe per model, one at a time (a Zipf trace may never ask the long tail's last model):
    whether each answers, by its own name, and its first token's wait (a switch to it, most of them)."""
    trace = [Request(0.0, name, [65 + i % 26] * 16, 4, True) for i, name in enumerate(names)]

    async def each() -> list[dict]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.request_timeout_s, connect=30)) as c:
            return [await send(c, url, r, time.perf_counter()) for r in trace]

    rows = asyncio.run(each())
    return {"answered": sum(r["outcome"] == "ok" for r in rows), "of": len(names),
            "rows": {r["model"]: {"outcome": r["outcome"], "ttft_s": r["ttft_s"]} for r in rows}}


def host_tier(mode: str, names: list[str], args: argparse.Namespace) -> frozenset[str]:
    """The models whose parked weights ``mode`` keeps in host memory (mixed: all but the ``--gpu-tier`` most
    popular, by default half)."""
    mode, suffixes = split_mode(mode)
    wrong = "_traffic" in suffixes  # tiers from traffic: the least popular start on the GPU tier
    mode = mode.removesuffix("_preempt")
    mode = {"preempt": "park"}.get(mode, mode)
    on_gpu = args.gpu_tier if args.gpu_tier is not None else (len(names) + 1) // 2  # mixed: the most popular first
    ranked = names[::-1] if wrong else names
    return frozenset(names if mode == "park_host" else ranked[on_gpu:] if mode == "mixed" else [])


def mode_config(mode: str, models: dict[str, Path], args: argparse.Namespace) -> tuple[str, list[str]]:
    """The front's config file and flags for ``mode``."""
    engine_args = shlex.split(args.engine_args) + (["--load-format", "auto"] if mode == "vllm_sleep" else [])
    host = host_tier(mode, list(models), args)
    mode, suffixes = split_mode(mode)
    traffic = "_traffic" in suffixes  # issue 69, part 3: tiers = "traffic"
    deadline = "_deadline" in suffixes  # issue 69: schedule = "deadline" (with preempt: its turns)
    recompute = "_nokv" in suffixes  # keep_kv = false: a paused stream continues by a new request
    preempt = mode.endswith("preempt")
    mode = {"preempt": "park"}.get(mode, mode.removesuffix("_preempt"))
    names = list(models)
    awake = {"one": 1, "park_x2": 2, "static": len(names)}.get(mode)  # else auto ("before": its own default, 1)
    awake = 1 if "_awake1" in suffixes else 2 if "_awake2" in suffixes else awake  # GPU time in turns, not memory
    text = "[switch]\n" + (f"max_awake = {awake}\n" if awake else "")
    text += f"schedule = \"{'deadline' if deadline else 'fifo' if mode == 'park_fifo' else 'fair'}\"\n"
    text += f"request_timeout_s = {args.request_timeout_s}\n" + ("preempt = true\n" if preempt else "")
    text += "keep_kv = false\n" if recompute else ""
    text += 'held_kv = "host"\n' if "_kvhost" in suffixes else ""
    text += f'tiers = "traffic"\ntier_window_s = {args.tier_window_s}\n' if traffic else ""
    text += f"turn_s = {args.turn_s}\n" if args.turn_s is not None else ""
    text += "compile_ahead = true\n" if args.compile_ahead else ""
    text += "read_ahead = false\n" if args.no_read_ahead else ""
    text += "".join(model_table(name, path, [], args.engine, engine_args, name in host) for name, path in
                    models.items())
    return text, ["--no-parking"] if mode == "restart" else []


def run_mode(mode: str, models: dict[str, Path], args: argparse.Namespace, sock: str, out: Path) -> dict:
    """One front for ``mode``, then every rate of the sweep on it, each ``--repeats`` times."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    text, flags = mode_config(mode, models, args)
    config = out / f"trace-{mode}.toml"
    config.write_text(text)
    log = out / f"trace-front-{mode}.log"
    env = None  # "before": its source tree first (the front's and its engines' hotweights), the rest as it was
    if mode == "before" and args.before_src:
        env = {"PYTHONPATH": os.pathsep.join(x for x in (str(args.before_src), os.environ.get("PYTHONPATH")) if x)}
    if mode == "before" and not args.before_src:
        raise SystemExit("before: --before-src names the source tree of the policy before (its src/)")
    front, startup_s = start_front([sys.executable, "-m", "hotweights", "switch", "--config", str(config), "--port",
                                    str(port), "--log-dir", str(out / f"trace-logs-{mode}"), *flags], url, sock, log,
                                   mode, env)
    names = list(models)
    result: dict = {"startup_s": round(startup_s, 1), "rates": {}}
    try:
        result["memory_by_tier"] = {"started": memory_by_tier(url, sock)}
        for rate in args.rate_list:
            at = at_rate(args, rate)
            runs = [run_trace(url, make_trace(names, at, rate, args.seed + i), at, host_tier(mode, names, args))
                    for i in range(args.repeats)]
            result["rates"][str(rate)] = {"runs": runs, **spread(runs)}
            print(json.dumps({mode: {"rate": rate, **{k: v for k, v in result["rates"][str(rate)].items()
                                                      if k != "runs"}}}), file=sys.stderr)
        result["memory_by_tier"]["after_trace"] = memory_by_tier(url, sock)
        result["roll_call"] = roll_call(url, names, args)
        result["states_after"] = {m["name"]: m["state"] for m in (status(url) or {"models": []})["models"]}
    finally:
        front.send_signal(signal.SIGINT)
        front.wait(120)
    text = log.read_text()
    engine_logs = {p.stem: p.read_text(errors="replace") for p in sorted((out / f"trace-logs-{mode}").glob("*.log"))}
    for cell in result["rates"].values():  # where each run's time went: wakes, turns, leaves, engines' tokens/s
        for run in cell["runs"]:
            since, until = (datetime.datetime.strptime(x, STAMP) for x in run["window"])
            run["turns"] = turns(text, engine_logs, since, until + datetime.timedelta(seconds=1))
    result["switch_lines"] = [x.split("switch: ", 1)[1] for x in text.splitlines()
                              if re.search(r"switch: \S+ (awake in|ready in|leaves for)", x)][:60]
    result["startup_timeline"] = startup_timeline(text)
    return result


STARTUP_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+ switch: (.*(?:preloading|ready in|together|"
                        r"starts beside|unavailable|host copy|GPU copy|starting again|compil).*)$")


def startup_timeline(log: str) -> list[str]:
    """The front's start-up as ``+SECONDS what`` (since its first line): the preloads begun, the compile ahead, the
    batches, the starts that joined, the host and GPU copies, each model's ready line, and any start again later
    (the first 80 such lines). The fill is read from it, not pieced together from the log by hand."""
    import datetime

    def at(stamp: str) -> float:
        return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()

    lines = log.splitlines()
    first = next((m.group(1) for x in lines if (m := re.match(r"^(\S+ \S+,\d{3}) ", x))), None)
    if first is None:
        return []
    return [f"+{at(m.group(1)) - at(first):.1f} s {m.group(2)}" for x in lines if (m := STARTUP_RE.match(x))][:80]


FIGURES = ("goodput_rps", "slo_attainment", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
           "switches", "crossed", "requests")


def spread(runs: list[dict]) -> dict:
    """Per figure the median of the runs, and their (min, max); a figure that is None in a run (a p99 that is a
    failure) counts as infinite, and a median that is infinite as None."""
    out: dict = {"repeats": len(runs)}
    for k in FIGURES:
        xs = sorted(math.inf if r.get(k) is None else r[k] for r in runs)
        finite = [x for x in xs if not math.isinf(x)]
        med = statistics.median(xs)
        out[k] = None if math.isinf(med) else round(med, 4)
        out[f"{k}_range"] = [round(xs[0], 4) if finite else None, None if math.isinf(xs[-1]) else round(xs[-1], 4)]
    if all("slos" in r for r in runs):  # each SLO's attainment, per tier: the median of the runs and their range
        out["slos"] = {tier: {slo: [statistics.median(v), min(v), max(v)] if (v := [
            r["slos"][tier][slo] for r in runs if r["slos"][tier][slo] is not None]) else None
            for slo, _t, _k in SLOS} for tier in runs[0]["slos"]}
    return out


def split_mode(mode: str) -> tuple[str, frozenset[str]]:
    """``mode`` without its suffixes (``SUFFIXES``, in the order they are written), and those it had."""
    had = []
    for suffix in SUFFIXES:  # the last written first
        if mode.endswith(suffix):
            had.append(suffix)
            mode = mode.removesuffix(suffix)
    return mode, frozenset(had)


def known(mode: str) -> bool:
    """Whether ``mode`` is one of ``MODES``, with its suffixes (``SUFFIXES``)."""
    return split_mode(mode)[0] in MODES


def ratios(result: dict, rates: list[float]) -> dict:
    """Per mode and rate, its median goodput and SLO attainment over static partitioning's (where static ran)."""
    ran = {m: r for m, r in result.items() if known(m) and isinstance(r, dict) and "rates" in r}
    if "static" not in ran:
        return {}
    out: dict = {}
    for mode, r in ran.items():
        if mode == "static":
            continue
        for rate in map(str, rates):
            mine, base = r["rates"].get(rate), ran["static"]["rates"].get(rate)
            if mine and base and base["goodput_rps"]:
                out.setdefault(mode, {})[rate] = {
                    "goodput_over_static": round(mine["goodput_rps"] / base["goodput_rps"], 3),
                    "slo_attainment": mine["slo_attainment"], "static_slo_attainment": base["slo_attainment"],
                    "ttft_p99_s": mine["ttft_p99_s"], "static_ttft_p99_s": base["ttft_p99_s"]}
    return out


def main() -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--gen-device", default="cpu")
    parser.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"])
    parser.add_argument("--engine-args", default="--max-model-len 4096")
    parser.add_argument("--modes", default="park,one,park_fifo,park_x2,park_host,restart,static")
    parser.add_argument("--duration-s", default="60", help="of each run of the trace: one value, or one per rate "
                        "of the sweep, the lowest rate's first (issue 69: 120,60 for 0.1 and 0.5 req/s)")
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second in all (Poisson)")
    parser.add_argument("--rates", default="", help="a sweep, the lowest first (comma-separated; default --rate)")
    parser.add_argument("--per-model-rate", default="",
                        help="R[,R...]: a Poisson process of R requests/s per model instead of Zipf-weighted --rates "
                             "(a sweep over the Rs)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each rate (seeds --seed, +1, ...)")
    parser.add_argument("--tpot-slo-s", type=float, default=0.1, help="the time per output token a request must meet")
    parser.add_argument("--before-src", type=Path, default=None, help="mode before: the src/ of the policy before")
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--burst-every-s", type=float, default=20.0)
    parser.add_argument("--burst-size", type=int, default=4)
    parser.add_argument("--prompt-tokens", default="32,2000")
    parser.add_argument("--max-tokens", default="16,128")
    parser.add_argument("--probe-every", type=int, default=5)
    parser.add_argument("--slo-s", type=float, default=2.0, help="the time to first token a request must meet")
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument("--turn-s", type=float, default=None, help="the fronts' turn_s (default: the front's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile-ahead", action="store_true",
                        help="the fronts' first start compiles beside its preload (compile_ahead = true)")
    parser.add_argument("--no-read-ahead", action="store_true",
                        help="the fronts read no checkpoint ahead of its preload (read_ahead = false)")
    parser.add_argument("--url", default="", help="a running front: run the trace against it once (mode given)")
    parser.add_argument("--names", default="", help="with --url: its models, most popular first")
    parser.add_argument("--socket-dir", default="", help="a keeper to use (and leave running): its entries serve")
    parser.add_argument("--models-dir", type=Path, default=None, help="where the demo models are (written if not)")
    parser.add_argument("--link-shards", action="store_true", help="models after m0 link m0's shards but their last "
                                                                   "(ten 8B models in 53 GB of disk)")
    parser.add_argument("--tier-window-s", type=float, default=60.0,
                        help="modes ending _traffic: tier_window_s, the window demand is counted over (default 60)")
    parser.add_argument("--gpu-tier", type=int, default=None, help="mixed: how many of the most popular models park "
                                                                   "on the GPU (default half); the rest in host memory")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--partial-json", type=Path, default=None, help="the results so far, after each mode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unknown = [m for m in args.modes.split(",") if not known(m)]
    if unknown and not args.url:
        parser.error(f"unknown mode(s) {', '.join(unknown)}: one of {', '.join(MODES)}, each with "
                     f"{', '.join(reversed(SUFFIXES))} where they apply")
    args.prompt_range = tuple(int(x) for x in args.prompt_tokens.split(","))
    args.max_tokens_range = tuple(int(x) for x in args.max_tokens.split(","))
    args.gpu = args.gen_device == "cuda" or args.engine == "vllm"
    args.rate_list = sorted(float(x) for x in args.rates.split(",")) if args.rates else [args.rate]
    if args.per_model_rate:  # the sweep's rates are each model's
        args.rate_list = sorted(float(x) for x in args.per_model_rate.split(","))
    out = args.out or Path(tempfile.mkdtemp(prefix="hw-trace-"))
    out.mkdir(parents=True, exist_ok=True)
    names = args.names.split(",") if args.url else [f"m{i}" for i in range(args.models)]
    durations = [float(x) for x in str(args.duration_s).split(",")]
    if len(durations) not in (1, len(args.rate_list)):
        parser.error(f"--duration-s: one value, or one per rate ({len(args.rate_list)}), the lowest rate's first")
    args.duration_of = dict(zip(args.rate_list, durations * len(args.rate_list) if len(durations) == 1 else durations))
    first = make_trace(names, at_rate(args, args.rate_list[0]), args.rate_list[0], args.seed)
    result: dict = {"trace": {"requests": len(first), "per_model": {n: sum(r.model == n for r in first) for n in names},
                              "probes": sum(r.probe for r in first), **{k: str(v) if isinstance(v, Path) else v
                                                                        for k, v in vars(args).items()
                                                                        if k not in ("out", "partial_json", "json",
                                                                                     "models_dir", "socket_dir")}}}
    if args.url:
        runs = [run_trace(args.url, make_trace(names, at_rate(args, rate), rate, args.seed + i), at_rate(args, rate))
                for rate in args.rate_list for i in range(args.repeats)]
        result["given"] = {"rates": {str(rate): {"runs": runs[j * args.repeats:(j + 1) * args.repeats],
                                                 **spread(runs[j * args.repeats:(j + 1) * args.repeats])}
                                     for j, rate in enumerate(args.rate_list)}}
    else:
        models = write_models(args.models_dir or out, [args.size] * args.models, args.gen_device, args.link_shards)
        sock = args.socket_dir or tempfile.mkdtemp(prefix="hw-trace-sock-", dir="/tmp")
        try:
            for mode in args.modes.split(","):
                try:
                    result[mode] = run_mode(mode, models, args, sock, out)
                except (SystemExit, OSError, ValueError, subprocess.TimeoutExpired) as e:  # the next modes still run
                    result[mode] = {"error": str(e)[-3000:]}
                print(json.dumps({mode: {k: v for k, v in result[mode].items() if k not in ("rates", "switch_lines")}}),
                      file=sys.stderr)
                if args.partial_json:
                    args.partial_json.write_text(json.dumps(result))
        finally:
            if not args.socket_dir:
                subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", sock], capture_output=True)
    ran = {m: r for m, r in result.items() if (known(m) or m == "given") and isinstance(r, dict) and "rates" in r}
    result["over_static"] = ratios(result, args.rate_list)
    result["crossed"] = sum(run["crossed"] for r in ran.values() for at in r["rates"].values() for run in at["runs"])
    result["command"] = "benchmarks/switch_trace.py " + " ".join(sys.argv[1:])
    print(json.dumps(result) if args.json else json.dumps({k: v for k, v in result.items()}, indent=1))
    return 1 if result["crossed"] else 0


if __name__ == "__main__":
    sys.exit(main())
