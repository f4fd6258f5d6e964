"""Issue 69's trace replayed in simulated time: the switch's own scheduler (``schedule.plan`` over ``Snapshot``s: its
turn clock, memory model and leaves) drives simulated vLLM engines on one GPU, so that a change to the scheduler can
be weighed on the CPU, in seconds, before a GPU lease. Predictions, not measurements: the engines are a model.

What is simulated, and from where:

- the trace: ``switch_trace.make_trace`` (per-model Poisson, prompts 32-2,000 tokens, outputs 32-512, probes), the
  same seeds as the GPU runs;
- the lifecycle, as ``lifecycle.py`` acts on a plan: one move at a time (``busy``); a leave pauses every stream of
  its engine (``--preempt``), held with its KV cache where the plan keeps it, else continued later by computing its
  prompt and tokens again; the leaving engine parks once the lock is free; a wake parks the room's idle engines
  first, then wakes, and lets every waiting request in; a paused stream waits again as a request due by its next
  token (``turns.token_due``); estimates of wakes and parks as ``model.lately`` keeps them; a new request let in
  joins its model's streams (its clock known, a leave able to pause it) ``--join-ms`` later, once its engine's answer
  began (an assumption: 10 ms); one that joins a leaving model ends in flight, as in the front (``--pause-on-join``:
  it pauses then). On an H100 at 91e7e2f such leaves held an awake place 43 s of a run, which the replay without
  the window did not show (98.8% predicted at Aegaeon's SLO, 71.4% measured);
- each engine as vLLM's scheduler runs it: a step decodes every running stream a token and prefills waiting ones
  within ``--max-num-batched-tokens``, at most ``--max-num-seqs`` streams; a step's GPU time is ``STEP_S`` plus
  ``SEQ_S`` a stream plus ``PREFILL_S`` a prompt token; engines awake together share the GPU evenly;
- costs measured on an H100 (``gpu_kv/fill5kv_h100_2026-12-06e.json``): a GPU-tier wake 7 ms, a host-tier wake
  0.343 s, parks 0.056 s and 0.071 s, one stream's decode step 6.6 ms, a probe's first token 26.5 ms; the prefill's
  rate (25,000 tokens/s, an 8B on an H100) is an assumption, as is the even share.

It prints, per mode and rate, each SLO's attainment (``switch_trace.attainment``: Aegaeon's, its 5 s one, ours; all,
GPU tier, host tier), the switches and the TTFT p99, and with ``--json`` the whole result.

Run: .venv/bin/python benchmarks/switch_sim.py                          (five 8B, three on the GPU tier: the H100's)
     .venv/bin/python benchmarks/switch_sim.py --models 10 --gpu-tier 6 --total-mib 143771 --seeds 0,1,2 --json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from dataclasses import dataclass, field, fields
from pathlib import Path

from switch_trace import Request, attainment, make_trace, percentile

from hotweights.switch.config import ModelConfig, SwitchConfig
from hotweights.switch.kinds import VllmKind
from hotweights.switch.memory import GpuNeed
from hotweights.switch.model import lately
from hotweights.switch.schedule import Plan, Wait, Wake, plan
from hotweights.switch.snapshot import Snapshot, View
from hotweights.switch.states import ModelState
from hotweights.switch.turns import token_due

S = ModelState
T0 = 1000.0  # the simulation's clock starts here: a stream's first_at of 0 means "no token yet"
DT = 0.001  # one tick, s
STEP_S, SEQ_S, PREFILL_S = 0.0062, 0.0001, 1 / 25000  # a vLLM step's GPU time: fixed, per stream, per prompt token
RELAY_S = 0.02  # the front's relay and the client, per token (a probe's first token: 26.5 ms)
JOIN_S = 0.01  # from a request let in to its stream among its model's (its engine's answer begun): an assumption
PAUSE_ON_JOIN = False  # True: one that joins a leaving model pauses then; False (the front): it ends in flight
WAKE_S = {False: 0.007, True: 0.343}  # by host tier
PARK_S = {False: 0.056, True: 0.071}
WEIGHTS_MIB = 15_626  # an 8B's weights (15.26 GiB)
SEQS, BATCHED = 32, 2048  # the GPU runs' --max-num-seqs and --max-num-batched-tokens
KV_TOKENS = (2 << 30) // (2 * 36 * 8 * 128 * 2)  # a 2 GiB KV cache of the demo 8B (Qwen3-8B's shape): 14,563 tokens
ENGINE_ARGS = ("--max-model-len", "4096", "--gpu-memory-utilization", "0.3", "--kv-cache-memory-bytes", "2G",
               "--max-num-seqs", str(SEQS), "--max-num-batched-tokens", str(BATCHED))
COMING = "coming" in {f.name for f in fields(View)}  # a commit before View.coming (PYTHONPATH) has none
MODES = ("mixed_preempt_deadline_awake2", "mixed_preempt_deadline", "mixed_preempt_nokv")  # the GPU runs' defaults


def mode_of(mode: str) -> tuple[str, int | str, bool]:
    """``switch_trace``'s mode names, those with preempt: the schedule (``_deadline``, else fair), ``max_awake``
    (``_awakeN``, else memory alone) and whether a held stream keeps its KV cache (not with ``_nokv``)."""
    if not mode.startswith("mixed_preempt"):
        raise SystemExit(f"{mode}: only the mixed_preempt modes are simulated")
    awake = re.search(r"_awake(\d+)", mode)
    return ("deadline" if "_deadline" in mode else "fair", int(awake.group(1)) if awake else "auto",
            "_nokv" not in mode)


@dataclass(eq=False)
class Stream:
    request: Request
    arrived: float
    todo: int  # tokens to compute before its next token: its prompt, or (paused without its KV) prompt and tokens
    tokens: list[float] = field(default_factory=list)  # each token's arrival at the client
    first_at: float = 0.0
    kv: int = 0  # tokens of it in its engine's KV cache
    joined: float = 0.0  # when it joins its model's streams (``JOIN_S`` after it was let in): a leave pauses it then

    def drop_kv(self) -> int:
        """Its KV cache gone (a park that keeps none, or vLLM's own preemption): its prompt and tokens computed
        again before its next token. The tokens that adds."""
        again = len(self.request.prompt) + len(self.tokens) - self.todo
        self.kv, self.todo = 0, self.todo + again
        return again

    @property
    def clock(self) -> tuple[float, float, int]:
        return self.arrived, self.first_at, len(self.tokens)


@dataclass(eq=False)
class Engine:
    config: ModelConfig
    need: GpuNeed
    host: bool
    state: ModelState = S.PARKED
    waiting: list[tuple[float, float | None, Stream]] = field(default_factory=list)  # came, due, stream
    running: list[Stream] = field(default_factory=list)
    wake_s: float | None = None
    park_s: float | None = None
    awake_at: float = 0.0
    last_used: float = 0.0
    left_for: str = ""
    kv_held: bool = False
    step: tuple[float, list[Stream], dict[Stream, int]] | None = None  # GPU time left, decoding, prefill chunks

    @property
    def name(self) -> str:
        return self.config.name

    def view(self, keeps_kv: bool, now: float) -> View:
        joined = [s for s in self.running if s.joined <= now]  # the streams a leave may pause: clocks known
        return View(self.config, self.state, self.need, waiting=len(self.waiting), inflight=len(self.running),
                    last_used=self.last_used, arrivals=tuple(a for a, _, _ in self.waiting),
                    dues=tuple(d for _, d, _ in self.waiting), awake_at=self.awake_at, wake_s=self.wake_s,
                    park_s=self.park_s, kv_held=self.kv_held, can_hold=keeps_kv and bool(joined),
                    left_for=self.left_for, clocks=tuple(s.clock for s in joined),
                    **({"coming": tuple(s.arrived for s in self.running if s.joined > now)} if COMING else {}))

    def next_step(self, seqs: int, batched: int) -> int:
        """vLLM's next step: every running stream with nothing to compute decodes a token, then those with a prompt
        (or a continuation) to compute take what is left of the step's tokens, first come first. The tokens its
        preemptions (a full KV cache) add."""
        again = 0
        decoding = [s for s in self.running if not s.todo][:seqs]
        while decoding and sum(s.kv for s in self.running) + len(decoding) > KV_TOKENS:
            last = decoding[-1]  # vLLM's preemption when its KV cache is full: the latest goes back, recomputed
            again += last.drop_kv()
            self.running.remove(last)
            self.running.append(last)
            decoding.pop()
        budget, chunks = batched - len(decoding), {}
        free = KV_TOKENS - sum(s.kv for s in self.running) - len(decoding)
        for s in self.running:
            if s.todo and min(budget, free) > 0 and len(decoding) + len(chunks) < seqs:
                chunks[s] = min(s.todo, budget, free)
                budget, free = budget - chunks[s], free - chunks[s]
        if decoding or chunks:
            work = STEP_S + SEQ_S * (len(decoding) + len(chunks)) + PREFILL_S * sum(chunks.values())
            self.step = (work, decoding, chunks)
        return again


@dataclass
class Op:
    """What holds the switch's lock: a park of a leaving engine, or a wake with its room's parks first."""

    ends: float
    parks: tuple[Engine, ...] = ()
    wake: Engine | None = None
    began: float = 0.0


class Sim:
    def __init__(self, trace: list[Request], config: SwitchConfig, host: set[str], total_mib: int) -> None:
        self.config, self.total_mib = config, total_mib
        parked, activations = VllmKind().engine_mib(ENGINE_ARGS)
        need = GpuNeed((0,), 0.3, WEIGHTS_MIB, kv_mib=2048, parked_mib=parked, engine_kv_mib=2048,
                       activations_mib=activations)
        self.engines = {c.name: Engine(c, need, c.name in host, wake_s=WAKE_S[c.name in host],
                                       park_s=PARK_S[c.name in host]) for c in config.models}
        first = self.engines[config.models[0].name]
        first.state, first.awake_at = S.AWAKE, T0
        self.arrivals = sorted(trace, key=lambda r: r.at_s)
        self.done: list[Stream] = []
        self.switches = 0
        self.prefilled = 0  # prompt (and continuation) tokens computed, all engines
        self.recomputed = 0  # of them, tokens computed again: a stream's KV cache dropped (a held one keeps it)
        self.held = 0  # streams held with their KV caches by a leave
        self.now = T0
        self.op: Op | None = None
        self.kicked, self.look_at = True, math.inf

    def run(self) -> list[Stream]:
        todo = len(self.arrivals)
        i = 0
        while len(self.done) < todo and self.now < T0 + 3600:
            while i < todo and T0 + self.arrivals[i].at_s <= self.now:
                self.arrive(self.arrivals[i])
                i += 1
            if self.op is not None and self.now >= self.op.ends:
                self.finish(self.op)
            self.joins()
            self.compute()
            if self.op is None:
                self.schedule()
            self.now += DT
        return self.done

    def arrive(self, r: Request) -> None:
        e = self.engines[r.model]
        s = Stream(r, self.now, len(r.prompt))
        if e.state is S.AWAKE:  # ``Ledger.enter``: an awake engine takes it at once
            s.joined = self.now + JOIN_S
            e.running.append(s)
        else:
            e.waiting.append((self.now, None, s))
        self.kicked = True

    def compute(self) -> None:
        """One tick of every engine that has work: the GPU shared evenly among them."""
        active = [e for e in self.engines.values() if e.state in (S.AWAKE, S.LEAVING) and e.running]
        for e in active:
            if e.step is None:
                self.recomputed += e.next_step(SEQS, BATCHED)
        active = [e for e in active if e.step is not None]
        for e in active:
            assert e.step is not None
            left, decoding, chunks = e.step
            left -= DT / len(active)
            if left > 0:
                e.step = (left, decoding, chunks)
                continue
            e.step = None
            for s, n in chunks.items():
                s.todo, s.kv = s.todo - n, s.kv + n
                self.prefilled += n
            for s in decoding:
                s.kv += 1
            for s in [*decoding, *(s for s in chunks if not s.todo)]:
                s.tokens.append(self.now + RELAY_S)
                s.first_at = s.first_at or s.tokens[0]
                if len(s.tokens) >= s.request.max_tokens:
                    e.running.remove(s)
                    self.done.append(s)
                    e.last_used, self.kicked = self.now, True

    def joins(self) -> None:
        """With ``PAUSE_ON_JOIN``, streams that join a leaving model pause then, as its leave paused the rest."""
        for e in self.engines.values():
            if e.state is S.LEAVING and PAUSE_ON_JOIN and any(s.joined <= self.now for s in e.running):
                self.pause(e, [s for s in e.running if s.joined <= self.now], e.kv_held)

    def schedule(self) -> None:
        leaving = [e for e in self.engines.values() if e.state is S.LEAVING and not e.running]
        if leaving:  # its park, once the lock is free (``Lifecycle.leave``)
            e = leaving[0]
            self.op = Op(self.now + PARK_S[e.host], parks=(e,), began=self.now)
            return
        if not self.kicked and self.now < self.look_at:
            return
        self.kicked, self.look_at = False, math.inf
        keeps = self.config.keep_kv
        views = tuple(e.view(keeps, self.now) for e in self.engines.values())
        p: Plan = plan(Snapshot(views, {0: self.total_mib}, self.now,
                                self.config.models[0].name), self.config)
        for x in p.leave:  # as ``Switcher._act``: one that leaves the GPU's time comes back by its own due (getattr:
            # a commit before ``Leave.ahead``, replayed through PYTHONPATH, has no such field)
            self.leave(self.engines[x.name], x.keep, "" if getattr(x, "ahead", False) else x.for_)
        if isinstance(p.then, Wake):
            parks = tuple(self.engines[n] for n in p.then.room.park)
            for e in parks:
                e.state = S.LEAVING
            park_s = max((PARK_S[e.host] for e in parks), default=0.0)
            e = self.engines[p.then.name]
            self.op = Op(self.now + park_s + WAKE_S[e.host], parks=parks, wake=e, began=self.now)
        elif isinstance(p.then, Wait) and p.then.look_in_s is not None:
            self.look_at = self.now + p.then.look_in_s

    def leave(self, e: Engine, keep: bool, to: str) -> None:
        """``Lifecycle.leave`` with ``preempt``: every stream paused, waiting again due by its next token."""
        e.state, e.left_for, e.step = S.LEAVING, to, None
        joined = [s for s in e.running if s.joined <= self.now]  # the rest are on their way to the engine
        e.kv_held = keep and bool(joined)
        self.pause(e, joined, e.kv_held)

    def pause(self, e: Engine, streams: list[Stream], keep: bool) -> None:
        """``streams`` of leaving ``e`` paused (``preempt.pause_all``): each waits again, due by its next token."""
        e.step = None
        for s in streams:
            self.held += keep
            if not keep:
                self.recomputed += s.drop_kv()
            e.waiting.append((self.now, token_due(*s.clock, self.config), s))
            e.running.remove(s)

    def finish(self, op: Op) -> None:
        for e in op.parks:
            e.state, e.step = S.PARKED, None
            e.park_s = lately(e.park_s, PARK_S[e.host])
        if op.wake is not None:
            e = op.wake
            e.state, e.awake_at, e.kv_held = S.AWAKE, self.now, False
            e.wake_s = lately(e.wake_s, self.now - op.began)
            for other in self.engines.values():
                other.left_for = "" if other.left_for == e.name else other.left_for
            for _, _, s in e.waiting:  # a new one joins its model's streams once its engine's answer began; a
                s.joined = self.now + (JOIN_S if not s.joined else 0.0)  # paused one as it gets its place
            e.running += [s for _, _, s in e.waiting]
            e.waiting = []
            self.switches += 1
        self.op, self.kicked = None, True


def rows_of(done: list[Stream]) -> list[dict]:
    """The streams as ``switch_trace``'s request rows (times from each request's arrival)."""
    rows = []
    for s in done:
        at = [t - s.arrived for t in s.tokens]
        tpot = (at[-1] - at[0]) / (len(at) - 1) if len(at) > 1 else 0.0
        rows.append({"model": s.request.model, "outcome": "ok", "ttft_s": at[0], "total_s": at[-1], "tpot_s": tpot,
                     "tokens": len(at), "token_at": at, "probe": s.request.probe})
    return rows


def simulate(mode: str, names: list[str], host: set[str], args: argparse.Namespace, rate: float,
             seed: int) -> dict:
    schedule, awake, keep = mode_of(mode)
    models = tuple(ModelConfig(n, Path("/sim") / n, parked_weights="host" if n in host else "gpu") for n in names)
    config = SwitchConfig(models, max_awake=awake, schedule=schedule, preempt=True, keep_kv=keep)
    trace_args = argparse.Namespace(zipf_s=1.1, prompt_range=(32, 2000), max_tokens_range=(32, 512), probe_every=5,
                                    per_model_rate=True, burst_size=0, burst_every_s=20.0,
                                    duration_s=args.duration_of[rate])
    sim = Sim(make_trace(names, trace_args, rate, seed), config, host, args.total_mib)
    rows = rows_of(sim.run())
    answered = {id(s.request) for s in sim.done}  # a replay cut at its hour (a stall) leaves some unanswered: misses
    unanswered = [{"model": r.model, "outcome": "unanswered", "ttft_s": None, "tpot_s": None, "token_at": []}
                  for r in sim.arrivals if id(r) not in answered]
    ttfts = [r["ttft_s"] if r["ttft_s"] is not None else math.inf for r in rows + unanswered]
    return {"requests": len(rows) + len(unanswered), "unanswered": len(unanswered), "switches": sim.switches,
            "slos": attainment(rows + unanswered, host), "ttft_p99_s": percentile(ttfts, 99)}


def said(mode: str, rate: float, cell: dict) -> str:
    """One cell as a line: each SLO's attainment, all and per tier ("-": the tier has no model), the switches."""
    def pct(key: str) -> str:
        return "-" if cell[key] is None else f"{cell[key]:.1%}"
    return (f"{mode:32s} {rate:4} req/s: Aegaeon's {pct('aegaeon_all')} (GPU tier {pct('aegaeon_gpu_tier')}, host "
            f"{pct('aegaeon_host_tier')}), ours {pct('ours_all')} ({pct('ours_gpu_tier')} / {pct('ours_host_tier')}), "
            f"{cell['switches']:.0f} switches" + (f", {cell['unanswered']} unanswered" if cell["unanswered"] else ""))


def main() -> int:
    global STEP_S, JOIN_S, PAUSE_ON_JOIN
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--gpu-tier", type=int, default=3, help="the first N models park on the GPU")
    parser.add_argument("--total-mib", type=int, default=81_559, help="the GPU's memory (an H100 80GB's)")
    parser.add_argument("--modes", default=",".join(MODES), help="mixed_preempt[_deadline][_awakeN][_nokv], ...")
    parser.add_argument("--rates", default="0.1,0.5")
    parser.add_argument("--seeds", default="0", help="one trace a seed (the GPU runs' first is 0)")
    parser.add_argument("--step-ms", type=float, default=STEP_S * 1e3,
                        help="a decode step's fixed GPU time (the H100's, measured; an H200 reads an 8B's weights "
                             "1.43x as fast: about 4.3 ms, a guess until measured)")
    parser.add_argument("--join-ms", type=float, default=JOIN_S * 1e3,
                        help="from a request let in to its stream among its model's (an assumption)")
    parser.add_argument("--host-wake-ms", type=float, default=WAKE_S[True] * 1e3,
                        help="a host-tier wake, its weights copied back (the H100's, measured); the GPU tier's "
                             "(7 ms) asks what the copy costs")
    parser.add_argument("--host-park-ms", type=float, default=PARK_S[True] * 1e3, help="a host-tier park")
    parser.add_argument("--pause-on-join", action="store_true",
                        help="a stream that joins a leaving model pauses then (the front: it ends in flight)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    STEP_S, JOIN_S, PAUSE_ON_JOIN = args.step_ms / 1e3, args.join_ms / 1e3, args.pause_on_join
    WAKE_S[True], PARK_S[True] = args.host_wake_ms / 1e3, args.host_park_ms / 1e3
    rates = [float(r) for r in args.rates.split(",")]
    args.duration_of = {r: 120.0 if r <= 0.1 else 60.0 for r in rates}
    names = [f"m{i}" for i in range(args.models)]
    host = set(names[args.gpu_tier:])
    result: dict = {"models": args.models, "gpu_tier": args.gpu_tier, "total_mib": args.total_mib,
                    "step_ms": args.step_ms, "join_ms": args.join_ms, "pause_on_join": PAUSE_ON_JOIN,
                    "host_wake_ms": args.host_wake_ms, "host_park_ms": args.host_park_ms, "modes": {}}
    for mode in args.modes.split(","):
        for rate in rates:
            runs = [simulate(mode, names, host, args, rate, int(seed)) for seed in args.seeds.split(",")]
            cell = {"runs": runs}
            for tier in ("all", "gpu_tier", "host_tier"):
                for slo in ("aegaeon", "ours"):
                    shares = [r["slos"][tier][slo] for r in runs]  # None: the tier has no model
                    cell[f"{slo}_{tier}"] = None if None in shares else statistics.median(shares)
            cell["switches"] = statistics.median(r["switches"] for r in runs)
            cell["unanswered"] = sum(r["unanswered"] for r in runs)  # every seed's, not a median
            result["modes"].setdefault(mode, {})[str(rate)] = cell
            if not args.json:
                print(said(mode, rate, cell))
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
