"""Start-up's preloads ahead of the starts (``switch/startup.py``), with fake engines: several at once, as many as
``preload_jobs`` and GPU memory admit; the starts one at a time where they profile the GPU's memory, the default
first, and several together beside the preloads where their KV caches are pinned (``schedule.startup_batch``); a
model a request waits for preloaded next; a preload that failed beside others tried again alone; the GPU need of each
engine kind.

Run: pytest tests/test_preloads.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
from test_switcher import FakeEngine, request, started, states

from hotweights.switch.config import ModelConfig, SwitchConfig
from hotweights.switch.upstream.engines import EngineError
from hotweights.switch.gpus import GpuMemory, gpu_memory
from hotweights.switch.kinds import KINDS, GpuNeed
from hotweights.switch.metrics import SwitchMetrics
from hotweights.switch.startup import Startup
from hotweights.switch.admit import Preloading, next_preload, start_to_reserve_for
from hotweights.switch.schedule import startup_batch
from hotweights.switch.snapshot import Snapshot
from hotweights.switch.states import PreloadOutcome, PreloadState, StartState
from hotweights.switch.switcher import Switcher

PRELOAD_S = 0.2


class SlowPreload(FakeEngine):
    """A fake engine whose preload takes ``PRELOAD_S`` and is recorded (name, began, ended) in ``spans``."""

    spans: list[tuple[str, float, float]]
    beside_fails = False  # its preload fails while another runs
    park_s = 0.0  # a park that takes its time

    def park(self, level: int, keep: bool = False) -> None:
        time.sleep(self.park_s)
        super().park(level, keep)

    def start(self) -> float:
        began = time.monotonic()
        took = super().start()
        self.spans.append((f"start {self.name}", began, time.monotonic()))
        return took

    already = False  # the keeper holds it: no preload process (a front started again)

    def cached_already(self) -> PreloadOutcome | None:
        return PreloadOutcome("already") if self.already else None

    preload_s = PRELOAD_S
    copy_s = 0.0  # its host copy after the preload (a host-tier model)

    def host_copy_after(self) -> str:
        if not self.copy_s:
            return ""
        self.spans.append((f"copy {self.name}", time.monotonic(), time.monotonic() + self.copy_s))
        time.sleep(self.copy_s)
        return f"its host copy made, {self.copy_s:.1f} s"

    ahead_s = 0.0  # the compile ahead of its start (0: none to run)
    ahead_fails = False

    def compiles_ahead(self, total_mib: int) -> bool:
        return bool(self.ahead_s)

    def compile_ahead(self, total_mib: int) -> float | None:
        if not self.ahead_s:
            return None
        began = time.monotonic()
        time.sleep(self.ahead_s)
        self.spans.append((f"compile {self.name}", began, time.monotonic()))
        if self.ahead_fails:
            raise EngineError(f"{self.name}'s compile ahead: its engine exited with code 1 while starting: CUDA out "
                              f"of memory")
        return self.ahead_s

    learns_kv = False  # pins the KV cache an engine's profile gave it, where it profiles too

    def pin_kv_as(self, other: FakeEngine) -> int:
        if not self.learns_kv or other is self or not self.need.profiles or not other.need.profiles:
            return 0
        self.need = dataclasses.replace(self.need, engine_kv_mib=2048)
        return 2048 << 20

    def preload(self) -> PreloadOutcome:
        began = time.monotonic()
        running = [s for s in self.spans if s[2] == 0.0]
        self.spans.append((self.name, began, 0.0))
        time.sleep(self.preload_s)
        self.spans[self.spans.index((self.name, began, 0.0))] = (self.name, began, time.monotonic())
        return PreloadOutcome("failed", "out of memory") if self.beside_fails and running else PreloadOutcome("cached")


def switcher(names: list[str], jobs: int, start_jobs: int = 0, totals: dict[int, int] | None = None,
             compile_ahead: bool = True, read_ahead: bool = True, need: GpuNeed | None = None,
             **engine) -> tuple[Switcher, dict[str, SlowPreload], list[str], list]:
    log: list[str] = []
    spans: list[tuple[str, float, float]] = []
    engines: dict[str, SlowPreload] = {}

    def factory(m: ModelConfig) -> SlowPreload:
        engines[m.name] = SlowPreload(m, log)
        engines[m.name].spans = spans
        if need is not None:  # every engine's, for the scheduler and the preloads alike
            engines[m.name].need = need
        for k, v in engine.get(m.name, {}).items():
            setattr(engines[m.name], k, v)
        return engines[m.name]

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in names), preload_jobs=jobs,
                          start_jobs=start_jobs, compile_ahead=compile_ahead, read_ahead=read_ahead)
    return Switcher(config, SwitchMetrics(), factory, totals), engines, log, spans


def on_one_gpu(monkeypatch, total_mib: int = 400_000, free_mib: int | None = None) -> None:
    """GPU 0's memory reads ``total_mib`` (``free_mib`` of it free)."""
    from hotweights.switch import startup as preloads

    monkeypatch.setattr(preloads, "gpu_memory", lambda: {0: GpuMemory(total_mib, total_mib if free_mib is None
                                                                      else free_mib)})


def most_at_once(spans: list[tuple[str, float, float]]) -> int:
    preloads = [x for x in spans if not x[0].startswith(("start ", "copy ", "compile "))]
    return max(sum(b <= t < e for _, b, e in preloads) for _, t, _ in preloads)


def test_preloads_run_ahead_of_the_starts_as_many_at_once_as_preload_jobs_and_the_starts_stay_in_order():
    async def main():
        s, _, log, spans = switcher(["a", "b", "c", "d"], jobs=3)
        began = time.monotonic()
        task = asyncio.create_task(s.run())
        while not all(m.started for m in s.models.values()) or s.life.busy.locked():
            await asyncio.sleep(0.005)
        took = time.monotonic() - began
        assert most_at_once(spans) == 3 and [n for n, _, _ in spans][:3] == ["a", "b", "c"]
        assert took < 3 * PRELOAD_S, took  # one after another: 4 x 0.2 s
        assert log == ["start a", "start b", "park b", "start c", "park c", "start d", "park d"]
        assert states(s) == {"a": "awake", "b": "parked", "c": "parked", "d": "parked"}
        task.cancel()
    asyncio.run(main())


def test_start_up_moves_each_preload_and_start_only_through_its_table():
    """Review f, move 2: a model's preload and start are states with one table and one door each, as its engine's
    are (``states.PRELOAD_MOVES``, ``START_MOVES``): start-up ends with every preload done and every start up, and
    a move the table lacks is refused with the model's name."""
    from hotweights.switch.states import PRELOAD_MOVES, START_MOVES, InvalidTransition

    async def main():
        s, engines, _, _ = switcher(["a", "b", "c"], jobs=2)
        engines["c"].beside_fails = True  # where its preload fails beside another: queued again alone, then done
        task = await started(s)
        assert {(m.preload, m.start_phase) for m in s.models.values()} == {(PreloadState.DONE, StartState.UP)}
        a = s.models["a"]
        with pytest.raises(InvalidTransition, match="a's preload: done -> running"):
            s.life.startup.preload_moves(a, PreloadState.RUNNING)
        with pytest.raises(InvalidTransition, match="a's start: up -> preparing"):
            s.life.startup.start_moves(a, StartState.PREPARING)
        task.cancel()
    asyncio.run(main())
    assert set(PRELOAD_MOVES) == set(PreloadState) and set(START_MOVES) == set(StartState)
    back = {frm for frm, to in START_MOVES.items() if StartState.WAITING in to}
    assert back == {StartState.UP, StartState.FAILED}  # only a reload (its table changed) takes a start back


def test_one_preload_job_is_the_start_up_of_before_each_preload_in_its_start():
    async def main():
        s, _, log, spans = switcher(["a", "b", "c"], jobs=1)
        task = await started(s)
        assert most_at_once(spans) == 1 and not s.life.startup.ahead
        preloads = [n for n, _, _ in spans if not n.startswith("start ")]
        assert preloads == ["a", "b", "c"] and log[0] == "start a"
        at = {n: (b, e) for n, b, e in spans}
        assert at["b"][0] >= at["start a"][1] and at["c"][0] >= at["start b"][1], spans  # each in its start
        task.cancel()
    asyncio.run(main())


def test_a_model_a_request_waits_for_is_preloaded_next():
    async def main():
        s, _, _, spans = switcher(["a", "b", "c", "d"], jobs=2)
        task = asyncio.create_task(s.run())
        while len(spans) < 2:  # a and b preload (a fixed sleep was too short under a loaded make test)
            await asyncio.sleep(0.002)
        asking = asyncio.create_task(s.requests.acquire("d"))
        m = await asking
        s.requests.release(m)
        assert [n for n, _, _ in spans if not n.startswith("start ")][:3] == ["a", "b", "d"]
        task.cancel()
    asyncio.run(main())


def test_a_preload_that_failed_beside_others_is_tried_again_alone():
    async def main():
        s, _, log, spans = switcher(["a", "b"], jobs=2, b={"beside_fails": True})
        task = await started(s)
        b_runs = [(b, e) for n, b, e in spans if n == "b"]
        a_end = next(e for n, _, e in spans if n == "a")
        assert len(b_runs) == 2 and b_runs[1][0] >= a_end  # the second alone, after a's
        assert states(s) == {"a": "awake", "b": "parked"}
        task.cancel()
    asyncio.run(main())


def test_an_engine_starts_with_no_preload_beside_it_on_its_gpu(monkeypatch):
    """vLLM sizes its KV cache from the whole GPU's memory: a preload allocating during a start corrupts it."""
    from hotweights.switch import startup as preloads

    def slow_memory() -> dict[int, GpuMemory]:  # nvidia-smi takes its time: a start may begin while it runs
        time.sleep(PRELOAD_S / 4)
        return {0: GpuMemory(100_000, 100_000)}

    monkeypatch.setattr(preloads, "gpu_memory", slow_memory)

    async def main():
        s, engines, _, spans = switcher(["a", "b", "c", "d"], jobs=2, need=GpuNeed((0,), weights_mib=1))
        for e in engines.values():
            e.delay_s = PRELOAD_S / 2
        task = await started(s)
        starts = [(b, e) for n, b, e in spans if n.startswith("start ")]
        loads = [(b, e) for n, b, e in spans if not n.startswith("start ")]
        assert len(starts) == 4 and len(loads) == 4 and most_at_once(spans) == 2
        assert not [(x, y) for x in starts for y in loads if x[0] < y[1] and y[0] < x[1]], spans  # none overlap
        task.cancel()
    asyncio.run(main())


def test_a_start_whose_preload_is_done_goes_before_a_new_preload_on_its_gpu(monkeypatch):
    """A start takes seconds and a vLLM preload minutes, and neither runs beside the other: a preload begun while
    a preloaded model waits its turn to start holds that start back a whole preload (on an H200, ten 8B: m7's
    18 s start waited 100 s behind m9's preload, begun while m6 parked)."""
    on_one_gpu(monkeypatch, 100_000)

    async def main():
        slow_park = {"park_s": PRELOAD_S / 2}  # the window in which a preload was admitted
        # c's preload ends first: ending with a's and b's, d was admitted at times while c's still ran (under load)
        s, _, _, spans = switcher(["a", "b", "c", "d"], jobs=3, need=GpuNeed((0,), weights_mib=1),
                                  **{n: slow_park for n in "abd"},
                                  c={**slow_park, "preload_s": PRELOAD_S / 2})
        task = await started(s)
        began = {n: b for n, b, _ in spans}
        assert [n for n, _, _ in spans if not n.startswith("start ")][:3] == ["a", "b", "c"]
        assert began["start c"] < began["d"], spans  # c was preloaded: it starts before d's preload begins
        task.cancel()
    asyncio.run(main())


def test_gpu_memory_admits_a_preload_only_beside_what_the_others_and_the_next_start_hold():
    need = GpuNeed((0,), share=0.25, weights_mib=15_000)  # at its peak 40 GB of 100; its start 10
    assert (need.preload_mib(100_000), need.start_mib(100_000)) == (40_000, 10_000)
    pinned = GpuNeed((0,), share=0.25, weights_mib=15_000, kv_mib=640, scratch_mib=3072)  # its own copy, the
    # published one, KV, vLLM's scratch
    assert pinned.preload_mib(100_000) == 30_000 + 640 + 3072 and pinned.preload_mib(200_000) == 50_000

    loader = GpuNeed((0,), share=0.25, weights_mib=15_000, kv_mib=640, loader_only=True)
    assert loader.preload_mib(100_000) == 15_000 + 1024 + 1024  # vLLM's loader alone: the weights, a pool, a context

    def run(free_mib: int, names: list[str], need: GpuNeed = need) -> int:
        async def main() -> int:
            s, _, _, spans = switcher(names, jobs=4, need=need)
            models = list(s.models.values())
            s.life.startup = Startup(models, 4, True, s.life.snapshot,
                                     lambda snap: start_to_reserve_for(snap, s.config), s.life.changes,
                                     memory=lambda: {0: GpuMemory(100_000, free_mib)})
            preloading = asyncio.create_task(s.life.startup.run())
            await asyncio.gather(*(s.life.startup.result(m) for m in s.models.values()))
            preloading.cancel()
            return most_at_once(spans)
        return asyncio.run(main())

    assert run(100_000, ["a", "b", "c"]) == 2  # a third would leave 20 GB for a 40 GB peak
    assert run(60_000, ["a", "b", "c"]) == 1  # one at a time: each after the other's peak is gone
    assert run(190_000, ["a", "b", "c", "d", "e"]) == 4  # preload_jobs bounds them too
    assert run(60_000, ["a", "b", "c"], loader) == 3  # 17 GB each, not 40


def test_the_next_preload_is_decided_from_one_snapshot_as_a_table():
    """Review e, move 1: the preloads' admission is a pure function of a snapshot, free memory and the start to
    leave room for; each row is one situation and what begins."""
    s, *_ = switcher(["a", "b", "c"], jobs=2)
    a, b, c = models = list(s.models.values())
    need = GpuNeed((0,), share=0.25, weights_mib=15_000, activations_mib=2048)  # at its peak 40 GB of 100; its
    # start 10
    cpu = GpuNeed(())

    def views(of, needs):
        return [dataclasses.replace(m.view(), need=needs) for m in of]

    def begins(free_mib: int, reserve_for=(), needs=need, **seen) -> str | None:
        p = Preloading(**{"jobs": 2, **seen})
        v = next_preload(views(models, needs), p, {0: GpuMemory(100_000, free_mib)}, views(reserve_for, needs))
        return v.name if v else None

    running_a = {"running": {"a": need}}
    assert begins(100_000) == "a"  # the head of the queue: start-up order
    assert begins(100_000, **running_a) == "b"  # 100 - 40 (a's peak) holds b's 40
    assert begins(60_000, **running_a) is None  # 20 left: b waits for a's peak to pass
    assert begins(90_000, (c,), **running_a) == "b" and begins(89_000, (c,), **running_a) is None  # c's start: 10
    assert begins(80_000, (a, c), **running_a) is None  # two starts going on: both reserved
    assert begins(100_000, jobs=1, **running_a) is None  # no job free
    assert begins(10_000) is None and begins(10_000, wanted=("a",)) == "a"  # alone for a start: vLLM decides
    assert begins(100_000, starting=(need,)) is None  # an engine starting on its GPU: it sizes its KV cache
    assert begins(100_000, needs=cpu, starting=(need,)) == "a"  # another device's start
    assert begins(100_000, done=frozenset({"a"})) is None  # a's start (seconds) before b's preload (minutes)
    assert begins(100_000, done=frozenset({"a"}), wanted=("b",)) == "b"  # unless a start waits for b
    pinned = GpuNeed((0,), share=0.25, weights_mib=15_000, kv_mib=2048, engine_kv_mib=2048, activations_mib=2048,
                     scratch_mib=3072)
    assert begins(100_000, needs=pinned, done=frozenset({"a"})) == "b"  # a's start profiles nothing: b goes beside
    assert begins(100_000, done=frozenset({"a"}), failed_beside=frozenset({"b"}), wanted=("b",)) == "b"
    assert begins(100_000, failed_beside=frozenset({"b"}), **{**running_a, "done": frozenset()}) is None  # alone
    assert begins(100_000, wanted=("a",), **running_a) == "b"  # the first start waits for a: b goes beside it
    compiling = {"compiling": {"a": need}}  # a's start waits for its compile ahead (17,048 MiB: weights, activations)
    assert need.ahead_mib == 15_000 + 2048
    assert begins(100_000, done=frozenset({"a"}), **compiling) == "b"  # b's preload goes meanwhile
    assert begins(97_048, **running_a, **compiling) == "b" and begins(97_047, **running_a, **compiling) is None
    c.ledger.arrive()  # a request waits for c: its preload goes first
    assert begins(100_000) == "c" and begins(100_000, wanted=("b",)) == "b"  # a start waiting goes before that

    def reserved() -> list[str]:
        return [v.name for v in start_to_reserve_for(s.life.snapshot(), s.config)]

    assert reserved() == ["c"]  # the scheduler's next start: c, a request waits for it
    a.start_phase = b.start_phase = StartState.PREPARING  # a and b starting (together): both, whatever comes next
    assert reserved() == ["a", "b"]
    assert begins(100_000, wanted=("c",), running={"c": need}) == "a"  # side by side


def test_each_engine_kind_says_what_its_preload_and_start_take_on_the_gpu(tmp_path, monkeypatch):
    from hotweights.demo_model import write_demo_model
    from hotweights.engines.vllm.kvpin import kv_pin
    from hotweights.switch import kinds

    monkeypatch.setattr(kinds, "is_cpu_build", lambda: False)  # what vLLM's GPU build needs (its CPU build: none)

    model = write_demo_model(tmp_path / "m", "small")
    mib = sum(p.stat().st_size for p in model.glob("*.safetensors")) >> 20  # its shards, as the preload reads them
    (model / "stray.safetensors").write_bytes(b"")  # not a shard of the index: not counted
    assert mib > 0
    vllm = KINDS["vllm"].gpu_need(ModelConfig("v", model, "vllm", ("--gpu-memory-utilization=0.25", "-tp", "2",
                                                                    "--max-model-len", "64")))
    embedded = KINDS["hotweights"].gpu_need(ModelConfig("e", model, args=("--device", "cuda:1"), gpus=(2, 3)))
    cpu = KINDS["hotweights"].gpu_need(ModelConfig("c", model))
    pinned = kv_pin(model, ["--max-model-len", "64"], 2) >> 20
    assert (vllm.gpus, vllm.share, vllm.weights_mib, vllm.kv_mib) == ((0, 1), 0.25, mib // 2, pinned)
    assert not vllm.loader_only  # two ranks: the preload is a whole vLLM start
    assert KINDS["vllm"].gpu_need(ModelConfig("v", model, "vllm", ("--max-model-len", "64"))).loader_only
    given = KINDS["vllm"].gpu_need(ModelConfig("v", model, "vllm", ("--kv-cache-memory-bytes", "1G")))
    assert given.kv_mib == 1024
    assert (embedded.gpus, embedded.weights_mib) == ((3,), mib) and embedded.extra_mib > 0
    assert cpu.gpus == () and gpu_memory(visible="") == {}
    assert KINDS["hotweights"].gpu_need(ModelConfig("e", tmp_path / "none", args=("--device", "cuda"))).weights_mib == 0


def test_a_vllm_preload_asks_for_the_kv_cache_of_one_sequence_unless_it_cannot_tell(tmp_path):
    from hotweights.engines.vllm.kvpin import CEILING, FLOOR, kv_given, kv_pin

    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    one = 2 * 32 * 8 * 128 * 2  # bytes of keys and values per token (an 8B of Llama's shape)
    assert kv_pin(tmp_path, ["--max-model-len", "4096"]) == int(one * 4096 * 1.25)  # 640 MiB
    assert kv_pin(tmp_path, ["--max-model-len=4K", "-tp", "2"], tp_size=2) == int(one * 4096 * 1.25) // 2
    assert kv_pin(tmp_path, ["--max-model-len", "64"]) == FLOOR
    assert kv_pin(tmp_path, []) is None  # 131072 tokens: over CEILING, vLLM sizes it
    assert kv_pin(tmp_path, ["--max-model-len", "4096", "--kv-cache-memory-bytes", "1G"]) is None  # the user's own
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "many"}))
    assert kv_pin(tmp_path, ["--max-model-len", "4096"]) is None
    assert CEILING > FLOOR
    # a size the arguments give is what the preload's and the start's need count (vLLM's own units)
    assert kv_given(["--kv-cache-memory-bytes", "4G"]) == 4 << 30 and kv_given(["--kv-cache-memory-bytes=2g"]) == 2e9
    assert kv_given([]) is None and kv_given(["--kv-cache-memory-bytes", "lots"]) is None


def test_the_front_says_whether_its_models_fit_each_gpu_at_the_worst_moment():
    """Ten 8B vLLM models on an H200, six on the GPU tier: at 0.25 each the awake host-tier model does not fit beside
    the GPU tier and nine parked engines (the sixth start found too little free); at 0.17 they do."""
    from hotweights.switch.fit import fits

    parked = KINDS["vllm"].parked_mib

    h200 = {0: GpuMemory(143_771, 143_000)}
    weights = 15_626  # an 8B's 15.26 GiB

    def config(share: float, host_from: int = 6, **switch) -> SwitchConfig:
        models = tuple(ModelConfig(f"m{i}", Path(f"/m/m{i}"), "vllm", ("--gpu-memory-utilization", str(share)),
                                   parked_weights="host" if i >= host_from else "gpu") for i in range(10))
        return SwitchConfig(models, **switch)

    def need(m: ModelConfig) -> GpuNeed:
        return GpuNeed((0,), float(m.args[1]), weights, parked_mib=parked)

    (tight,) = fits(config(0.25), need, h200)
    assert (tight.kept, tight.awake, tight.parked) == (6, 1, 9) and tight.kept_mib == 6 * weights
    awake = int(0.25 * 143_771 + 1) - weights + parked + weights  # a host-tier model, its weights back
    assert tight.awake_mib == awake and tight.need_mib > tight.total_mib and "does not fit" in tight.line()
    assert 'parked_weights = "host"' in tight.line()
    (fine,) = fits(config(0.17), need, h200)
    assert fine.need_mib <= fine.total_mib and "does not fit" not in fine.line()
    assert fine.line().startswith("GPU 0: at most about ")
    assert fine.fit_awake == 1 and fine.line().endswith("1 of 10 fit awake at once")
    (two,) = fits(config(0.17, max_awake=2), need, h200)  # a cap of two, but memory holds one host-tier one awake
    assert two.awake == 1 and two.awake_mib == fine.awake_mib
    (three,) = fits(config(0.25, host_from=0, max_awake="auto"), need, {0: GpuMemory(143_771, 143_000)})
    assert three.fit_awake == 3  # ten 8B at 0.25, every parked one in host memory: three awake at once
    few = SwitchConfig(config(0.25).models[:3])  # issue 52: three 8B at 0.25 fit an H200 awake together
    (static,) = fits(few, need, h200)
    assert static.fit_awake == static.awake == 3 and static.need_mib <= static.total_mib, static.line()
    assert fits(config(0.17), need, {1: GpuMemory(143_771, 143_000)}) == []  # none of them on GPU 1
    assert fits(config(0.17), lambda m: GpuNeed(()), h200) == []  # CPU engines: nothing to say


PINNED = GpuNeed((0,), share=0.17, weights_mib=15_000, kv_mib=2048, parked_mib=1950, engine_kv_mib=2048,
                 activations_mib=2048, scratch_mib=3072)  # vLLM's, as ``VllmKind.gpu_need`` gives it


def overlapping(spans: list[tuple[str, float, float]], prefix: str) -> int:
    """The most spans whose name starts with ``prefix`` (``"start "``: starts) that ran at one moment."""
    chosen = [x for x in spans if x[0].startswith(prefix)]
    return max(sum(b <= t < e for _, b, e in chosen) for _, t, _ in chosen)


def test_starts_whose_kv_cache_is_pinned_go_together_beside_the_preloads(monkeypatch):
    """vLLM 0.26 skips its memory profile where --kv-cache-memory-bytes is given: such starts neither corrupt nor
    are corrupted by each other or a preload. On an H200 ten 8B took 581.6 s to serve, each ~20 s start alone and
    no preload beside it (gpu_load/fill_2026-12-04.json)."""
    on_one_gpu(monkeypatch)

    async def main():
        names = ["a", "b", "c", "d", "e"]
        s, engines, log, spans = switcher(names, jobs=4, start_jobs=3, totals={0: 400_000})
        for e in engines.values():
            e.need, e.delay_s = PINNED, PRELOAD_S
        task = await started(s)
        assert overlapping(spans, "start ") == 3, spans  # b, c, d together, after a
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        loads = {n: (b, e) for n, b, e in spans if not n.startswith("start ")}
        assert starts["a"][1] <= min(starts[n][0] for n in "bcd"), spans  # the default first, alone
        assert loads["e"][0] < starts["a"][1], spans  # e's preload went beside a's start
        assert loads["b"][0] < loads["a"][1], spans  # and b's beside a's preload, which the first start waits for
        assert states(s) == {"a": "awake", "b": "parked", "c": "parked", "d": "parked", "e": "parked"}
        assert s.life.ready.is_set()
        task.cancel()
    asyncio.run(main())


def test_a_host_copy_after_a_preload_leaves_its_job_to_the_next_preload():
    """A host-tier model's host copy, made after its preload, takes none of the GPU memory nor the job the preload
    was admitted with: inside the job it kept the next preloads out 17.5-18.3 s per host-tier model (H200, ten 8B).
    Its start still waits for it, and its ready line says it."""
    async def main():
        s, engines, log, spans = switcher(["a", "b", "c"], jobs=2)
        engines["a"].copy_s = engines["b"].copy_s = 4 * PRELOAD_S
        task = await started(s)
        at = {n: (b, e) for n, b, e in spans}
        assert at["c"][0] < at["copy a"][1] - 2 * PRELOAD_S, spans  # c began while a's host copy was made
        assert at["start b"][0] >= at["copy b"][1], spans
        assert s.models["b"].cached.startswith("cached (its host copy made, 0.8 s)"), s.models["b"].cached
        task.cancel()
    asyncio.run(main())


def test_a_model_whose_preload_ends_while_others_start_joins_their_starts(monkeypatch):
    """On an H200 (ten 8B, KV caches pinned) each batch of start-up's starts ran to its end before the next began: a
    model whose preload was done waited for the slowest start of the batch before it. It now starts at once beside
    them, within ``start_jobs`` and memory, once the front's first engine is up (the first start compiles)."""
    on_one_gpu(monkeypatch)

    async def main():
        s, engines, log, spans = switcher(["a", "b", "c", "d"], jobs=4, start_jobs=2, totals={0: 400_000})
        for e in engines.values():
            e.need, e.delay_s = PINNED, PRELOAD_S
        engines["b"].delay_s = 8 * PRELOAD_S  # a slow start, after a's: c and d not preloaded yet
        engines["c"].preload_s = engines["d"].preload_s = 3 * PRELOAD_S
        task = await started(s)
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        assert starts["b"][0] >= starts["a"][1], spans
        assert starts["c"][0] < starts["b"][1] - 4 * PRELOAD_S, spans  # c joined b's start (a was up)
        assert starts["d"][0] >= starts["c"][1] - PRELOAD_S / 2, spans  # start_jobs = 2: d once c's ended
        assert starts["d"][0] < starts["b"][1], spans
        assert overlapping(spans, "start ") == 2, spans
        assert states(s) == {"a": "awake", "b": "parked", "c": "parked", "d": "parked"}
        task.cancel()
    asyncio.run(main())


def test_no_start_joins_while_a_request_waits_for_a_model_that_has_started(monkeypatch):
    """A request for a parked model waits for the starts going on to end (they hold the switch); a start joining them
    meanwhile would make it wait longer still. Its switch goes first, then the start-up's next start."""
    on_one_gpu(monkeypatch)

    async def main():
        s, engines, log, spans = switcher(["a", "b", "c", "d"], jobs=4, start_jobs=2, totals={0: 400_000})
        for e in engines.values():
            e.need, e.delay_s = PINNED, PRELOAD_S / 4
        engines["b"].preload_s = engines["c"].preload_s = PRELOAD_S / 2
        engines["c"].delay_s = 8 * PRELOAD_S  # b and c start together after a; c's start is slow
        engines["d"].preload_s = 5 * PRELOAD_S  # it ends during c's start
        task = asyncio.create_task(s.run())
        while "park b" not in log:
            await asyncio.sleep(0.002)
        asking = asyncio.create_task(request(s, "b"))  # b has started and parked: a request waits for it
        await asking
        while not all(m.started for m in s.models.values()) or s.life.busy.locked():
            await asyncio.sleep(0.002)
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        assert starts["d"][0] >= starts["c"][1], spans  # d did not join c's start
        assert log.index("wake b") < log.index("start d"), log  # b's switch first
        task.cancel()
    asyncio.run(main())


def test_no_start_joins_the_first_start_of_the_front(monkeypatch):
    """The first start compiles the engine's code (74.9 s for an 8B on an H200, against 16-37 s after it): a start
    beside it would compile too. Models whose preloads end during it wait for it."""
    on_one_gpu(monkeypatch)

    async def main():
        s, engines, log, spans = switcher(["a", "b"], jobs=2, start_jobs=2, totals={0: 400_000})
        for e in engines.values():
            e.need, e.delay_s = PINNED, PRELOAD_S
        engines["a"].delay_s = 6 * PRELOAD_S
        engines["b"].preload_s = 2 * PRELOAD_S
        task = await started(s)
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        assert starts["b"][0] >= starts["a"][1], spans
        task.cancel()
    asyncio.run(main())


def test_starts_join_the_first_start_of_the_front_once_its_log_says_its_code_is_compiled(monkeypatch, caplog):
    """Where nothing compiles ahead, the first start compiles itself; once its log says the compile has ended (and
    the compile cache is saved), a start beside it loads that code: the models whose preloads are done join it
    then, not once it is up (three 8B on an H100: the first start 66.6 s, 36 s of it torch.compile)."""
    on_one_gpu(monkeypatch)

    async def main():
        s, engines, log, spans = switcher(["a", "b", "c"], jobs=3, start_jobs=3, totals={0: 400_000},
                                          compile_ahead=False)
        for e in engines.values():
            e.need, e.delay_s, e.compiled_after_s = PINNED, 2 * PRELOAD_S, PRELOAD_S / 2  # b, c load a's code
        engines["a"].delay_s, engines["a"].compiled_after_s = 8 * PRELOAD_S, 3 * PRELOAD_S
        task = await started(s)
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        assert overlapping(spans, "start ") == 3, spans  # b and c beside a
        assert min(starts[n][0] for n in "bc") >= starts["a"][0] + 3 * PRELOAD_S, spans  # once a had compiled
        assert max(starts[n][0] for n in "bc") < starts["a"][1] - 2 * PRELOAD_S, spans  # well before a was up
        task.cancel()

    with caplog.at_level("INFO", logger="hotweights.switch"):
        asyncio.run(main())
    assert caplog.text.count("switch: a's start has compiled its engine's code (its log says so): the starts whose "
                             "preloads are done may join it now") == 1
    assert caplog.text.count("start has compiled") == 1  # not again for b and c


def test_a_first_start_that_profiles_is_joined_once_its_profile_is_done_by_models_that_take_its_kv_cache(
        monkeypatch, caplog):
    """The front's defaults (vLLM sizes its KV cache from a profile of the GPU): the first start's compile ends
    before its profile does; the models that would profile as it did join it once its profile has given their KV
    cache, not before (their allocations would count as its own), and profile nothing themselves."""
    from hotweights.switch import startup as preloads

    need = GpuNeed((0,), share=0.25, weights_mib=15_000, parked_mib=1950)  # its KV cache from a profile
    monkeypatch.setattr(preloads, "gpu_memory", lambda: {0: GpuMemory(400_000, 400_000)})

    async def main():
        s, engines, _, spans = switcher(["a", "b", "c"], jobs=3, start_jobs=3, totals={0: 400_000},
                                        compile_ahead=False)
        for e in engines.values():
            e.need, e.delay_s, e.learns_kv = need, 2 * PRELOAD_S, True
        a = engines["a"]
        a.delay_s, a.compiled_after_s, a.profiled_after_s = 10 * PRELOAD_S, 2 * PRELOAD_S, 5 * PRELOAD_S
        task = await started(s)
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        assert min(starts[n][0] for n in "bc") >= starts["a"][0] + 5 * PRELOAD_S, spans  # not before its profile
        assert max(starts[n][0] for n in "bc") < starts["a"][1] - 2 * PRELOAD_S, spans
        assert a.need.profiles and not any(engines[n].need.profiles for n in "bc")
        task.cancel()

    with caplog.at_level("INFO", logger="hotweights.switch"):
        asyncio.run(main())
    assert caplog.text.count("switch: b, c start with the KV cache vLLM's profile gave a") == 1


def test_starts_join_the_first_start_of_the_front_once_its_code_is_compiled_ahead(monkeypatch):
    """With the code compiled ahead the first start compiles nothing: the models whose preloads ended meanwhile start
    beside it, all once the compile has ended (a start begun before would compile too)."""
    on_one_gpu(monkeypatch)

    async def main():
        s, engines, log, spans = switcher(["a", "b", "c"], jobs=3, start_jobs=3, totals={0: 400_000},
                                          a={"ahead_s": 4 * PRELOAD_S})
        for e in engines.values():
            e.need, e.delay_s = PINNED, 2 * PRELOAD_S
        task = await started(s)
        span = {n: (b, e) for n, b, e in spans}
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        assert overlapping(spans, "start ") == 3, spans  # b and c beside a
        assert min(b for b, _ in starts.values()) >= span["compile a"][1], spans
        task.cancel()
    asyncio.run(main())


def test_a_front_started_again_on_a_full_keeper_runs_no_preload_job_and_starts_its_models_together(monkeypatch):
    """Models the keeper holds already need no preload and no memory for one. Admitted as preloads, they waited one
    by one for room for a whole preload on a GPU the keeper's entries filled, behind the starts, so no start went
    beside another (H200, ten 8B, a front started again)."""
    on_one_gpu(monkeypatch, 140_000, 20_000)  # no room for a preload

    async def main():
        names = ["a", "b", "c", "d"]
        s, engines, log, spans = switcher(names, jobs=4, start_jobs=4, totals={0: 140_000})
        for e in engines.values():
            e.need, e.delay_s, e.already = PINNED, PRELOAD_S, True
        task = await started(s)
        assert not [n for n, _, _ in spans if not n.startswith("start ")], spans  # no preload ran
        assert overlapping(spans, "start ") == 3, spans  # b, c, d together, after a
        assert states(s) == {"a": "awake", "b": "parked", "c": "parked", "d": "parked"}
        assert all(m.cached == "cached already" for m in s.models.values())
        task.cancel()
    asyncio.run(main())


def test_starts_that_profile_the_gpu_stay_one_at_a_time_whatever_start_jobs_says(monkeypatch):
    need = GpuNeed((0,), share=0.17, weights_mib=15_000, parked_mib=1950)  # its KV cache from a profile
    on_one_gpu(monkeypatch)

    async def main():
        s, engines, _, spans = switcher(["a", "b", "c", "d"], jobs=4, start_jobs=4, totals={0: 400_000})
        for e in engines.values():
            e.need, e.delay_s = need, PRELOAD_S / 2
        task = await started(s)
        assert overlapping(spans, "start ") == 1, spans
        task.cancel()
    asyncio.run(main())


def test_starts_that_would_profile_as_the_first_did_take_its_kv_cache_and_go_together(monkeypatch, caplog):
    """Three 8B with the front's defaults on an H200: each start after the first profiled the GPU alone (60.4 s and
    31.5 s), its preload (4.5 s) waiting for the start before it. The first start's profile gives the KV cache of
    every model that starts as it does; pinned to it, those profile nothing and start together."""
    from hotweights.switch import startup as preloads

    need = GpuNeed((0,), share=0.25, weights_mib=15_000, parked_mib=1950)  # its KV cache from a profile
    monkeypatch.setattr(preloads, "gpu_memory", lambda: {0: GpuMemory(400_000, 400_000)})

    async def main():
        s, engines, _, spans = switcher(["a", "b", "c", "d"], jobs=4, start_jobs=3, totals={0: 400_000})
        for e in engines.values():
            e.need, e.delay_s, e.learns_kv = need, PRELOAD_S, True
        task = await started(s)
        starts = {n[6:]: (b, e) for n, b, e in spans if n.startswith("start ")}
        loads = {n: (b, e) for n, b, e in spans if not n.startswith("start ")}
        assert overlapping(spans, "start ") >= 2, spans  # b and c together (1 where they profile)
        assert starts["a"][1] <= min(starts[n][0] for n in "bcd"), spans  # after a's, which profiled alone
        assert loads["d"][0] < max(starts[n][1] for n in "bc"), spans  # d's preload beside their starts
        assert engines["a"].need.profiles and not any(engines[n].need.profiles for n in "bcd")
        task.cancel()

    with caplog.at_level("INFO", logger="hotweights.switch"):
        asyncio.run(main())
    assert ("switch: b, c, d start with the KV cache vLLM's profile gave a (2.00 GiB; --kv-cache-memory-bytes "
            "2147483648): they profile nothing, so they start beside each other and the preloads") in caplog.text


def test_a_vllm_engine_pins_the_kv_cache_a_profile_gave_an_engine_that_starts_as_it_does(tmp_path, monkeypatch):
    """Only where vLLM's profile would give both the same: the same arguments, GPUs, config files and weights."""
    from hotweights.demo_model import write_demo_model
    from hotweights.engines.vllm.kvpin import kv_profiled
    from hotweights.switch import kinds
    from hotweights.switch.upstream.engines import Engine

    monkeypatch.setattr(kinds, "is_cpu_build", lambda: False)
    small, tiny = write_demo_model(tmp_path / "s", "small"), write_demo_model(tmp_path / "t", "tiny")
    seed = write_demo_model(tmp_path / "s1", "small", seed=1)  # other weights, the same config
    args = ("--max-model-len", "512", "--gpu-memory-utilization", "0.25")

    def engine(name: str, model: Path, *extra: str, log: str = "") -> Engine:
        e = Engine(ModelConfig(name, model, "vllm", (*args, *extra)), tmp_path, start_jobs=3)
        e.log_path.write_text(log)
        return e

    profiled = "INFO [gpu_worker.py:562] Available KV cache memory: 21.43 GiB\nINFO GPU KV cache size: 175,536 tokens\n"
    first = engine("first", small, log=profiled)
    assert kv_profiled(profiled) == int(21.425 * (1 << 30))
    assert kv_profiled("rank 0 Available KV cache memory: 21.43 GiB\nrank 1 Available KV cache memory: 21.4 GiB") \
        == int(21.395 * (1 << 30))  # one line per rank: the least
    assert kv_profiled("Initial free memory 139.2 GiB, reserved 2.0 GiB memory for KV Cache") is None  # pinned
    same, other_args, other_config = engine("same", seed), engine("x", seed, "--max-num-seqs", "8"), engine("y", tiny)
    given = engine("z", seed, "--kv-cache-memory-bytes", "1G")
    assert [e.pin_kv_as(first) for e in (other_args, other_config, given, first)] == [0, 0, 0, 0]
    assert same.gpu_need().profiles and same.pin_kv_as(first) == kv_profiled(profiled)
    assert not same.gpu_need().profiles and same.gpu_need().engine_kv_mib == kv_profiled(profiled) >> 20
    cmd = same.command(8000)[0]
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(kv_profiled(profiled))
    assert same.keeper.env["HOTWEIGHTS_STANDBYS"] == "4"  # it may start with two others now: a standby each
    assert engine("w", seed).pin_kv_as(engine("quiet", small)) == 0  # no profile line: nothing to pin
    assert engine("v", seed).pin_kv_as(same) == 0  # same profiled nothing (pinned)


def test_a_vllm_start_says_it_has_compiled_and_profiled_only_from_its_own_running_output(tmp_path, monkeypatch):
    """``Engine.compiled``/``profiled`` read the start going on: a log an earlier front left (appended to) says
    nothing while no process of this start runs."""
    import subprocess

    from hotweights.demo_model import write_demo_model
    from hotweights.switch import kinds
    from hotweights.switch.upstream.engines import Engine

    monkeypatch.setattr(kinds, "is_cpu_build", lambda: False)
    model = write_demo_model(tmp_path / "s", "small")
    earlier = ("INFO [monitor.py:48] torch.compile took 35.81 s in total\n"
               "INFO [gpu_worker.py:562] Available KV cache memory: 21.43 GiB\n")
    e = Engine(ModelConfig("a", model, "vllm", ("--gpu-memory-utilization", "0.25")), tmp_path, start_jobs=3)
    e.log_path.write_text(earlier)
    assert not e.compiled() and not e.profiled()  # no start runs: the earlier front's lines
    e.process._log_from = e.log_path.stat().st_size
    e.process.proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not e.compiled() and not e.profiled()  # this start has said nothing yet
        with open(e.log_path, "a") as f:
            f.write("INFO [backends.py:1095] Using cache directory: /c/torch_compile_cache/663cfa9ddf/rank_0_0/backbone"
                    " for vLLM's torch.compile\nINFO [monitor.py:48] torch.compile took 7.03 s in total\n")
        assert e.compiled() and not e.profiled()  # start-up's table remembers it (``Startup.start_moves``)
        with open(e.log_path, "a") as f:
            f.write("INFO [gpu_worker.py:562] Available KV cache memory: 3.02 GiB\n")
        assert e.profiled()
    finally:
        e.process.proc.kill()
        e.process.proc.wait()
    assert not e.compiled()  # it exited
    eager = Engine(ModelConfig("b", model, "vllm", ("--enforce-eager",)), tmp_path)
    assert KINDS["vllm"].compiled_in(eager.model, "") and not KINDS["vllm"].compiled_in(e.model, "")
    assert not KINDS["hotweights"].compiled_in(e.model, "torch.compile took 1.00 s in total")


def test_the_starts_that_go_together_are_decided_from_memory_as_a_table():
    """``startup_batch``: start-up order, preloads done, ``start_jobs``, and every GPU holding them all resident
    beside the preloads running; just the first where its start profiles, or it is a start again."""
    s, engines, _, _ = switcher(["a", "b", "c", "d"], jobs=4)
    a, b, c, d = models = list(s.models.values())
    for e in engines.values():
        e.need = PINNED
    one = 15_000 + 2048 + 2048 + 1950  # an 8B resident with its KV cache pinned: weights, KV, activations, parked

    def batch(total_mib: int, jobs: int = 4, done: str = "abcd", preloading: int = 0) -> str:
        views = tuple(dataclasses.replace(m.view(), preload=PreloadState.DONE if m.name in done else
                                          PreloadState.RUNNING) for m in models)
        running = {"x": GpuNeed((0,), weights_mib=preloading)}  # a preload whose peak is ``preloading``
        snap = Snapshot(views, {0: total_mib}, 0.0, "a", preloads_ahead=True, running=running)
        return "".join(startup_batch(snap["a"], snap, dataclasses.replace(s.config, start_jobs=jobs)))

    room = 1024 + 4 * one  # the reserve, and four resident (a model not starting keeps its weights on the GPU)
    assert batch(room) == "abcd"
    assert batch(room - 1) == "abc"  # d resident would not fit beside the three: only its weights do
    assert batch(room, preloading=one - 15_000) == "abc"  # a preload's peak counts too
    assert batch(room, jobs=2) == "ab"
    assert batch(room, done="ad") == "ad"  # b and c still preload
    d.config = ModelConfig("d", Path("/m/d"), start="cached")
    assert batch(room) == "abc"  # a cached model starts for its first request
    b.start_phase = StartState.PREPARING
    assert batch(room) == "ac"
    a.start_phase = StartState.FAILED
    assert batch(room) == "a"  # a start again (after a failure): alone
    a.start_phase, engines["a"].need = StartState.WAITING, GpuNeed((0,), share=0.17, weights_mib=15_000)
    assert batch(room) == "a"  # a profiles the GPU: alone


def test_fewer_sequences_and_tokens_per_vllm_engine_leave_room_for_two_host_tier_models_awake():
    """Ten 8B on an H200 (six on the GPU tier, KV caches of 2 GiB): vLLM's CUDA graphs for batches of up to 512
    stay on the GPU in every parked engine (1.9 GiB each, read there), and an awake engine's activations reach
    3.1 GiB at 8,192 tokens a step (read on an H100 after a minute of prompts of up to 2,000 tokens), so one
    host-tier model fits awake; with ``--max-num-seqs 32`` its graphs are for batches of up to 64 (976 MiB parked,
    read there), with ``--max-num-batched-tokens 2048`` its activations a quarter, and with both two fit."""
    from hotweights.switch.fit import fits, say_fit, with_fewer_seqs
    from hotweights.switch.kinds import VLLM_ACTIVATIONS_MIB

    assert KINDS["vllm"].engine_mib([]) == (KINDS["vllm"].parked_mib, VLLM_ACTIVATIONS_MIB + 1024)  # the defaults
    assert VLLM_ACTIVATIONS_MIB >= 3188  # above the H100's reading (fill5kv_h100_2026-12-06d.json)
    parked, activations = KINDS["vllm"].engine_mib(["--max-num-seqs", "32"])
    assert 976 <= parked < 1400 and activations == VLLM_ACTIVATIONS_MIB + 32  # above what the H200 read, not far
    assert KINDS["vllm"].engine_mib(["--max-num-seqs", "32", "--max-num-batched-tokens", "2048"])[1] == \
        VLLM_ACTIVATIONS_MIB // 4 + 32
    assert KINDS["vllm"].engine_mib(["--max-num-batched-tokens", "64"])[1] == 512 + 1024  # never under 512 MiB
    assert KINDS["vllm"].engine_mib(["--max-num-seqs", "32", "--enforce-eager"])[0] < parked  # no graphs at all
    assert KINDS["vllm"].engine_mib(["--max-num-seqs", "many"]) == KINDS["vllm"].engine_mib([])  # vLLM says why

    def config(*extra: str) -> SwitchConfig:
        args = ("--gpu-memory-utilization", "0.17", "--kv-cache-memory-bytes", "2G", *extra)
        return SwitchConfig(tuple(ModelConfig(f"m{i}", Path(f"/m/m{i}"), "vllm", args,
                                              parked_weights="host" if i >= 6 else "gpu") for i in range(10)))

    def need(m: ModelConfig) -> GpuNeed:
        parked, activations = KINDS["vllm"].engine_mib(m.args)
        return GpuNeed((0,), 0.17, 15_626, kv_mib=2048, parked_mib=parked, engine_kv_mib=2048,
                       activations_mib=activations)

    h200 = {0: GpuMemory(143_771, 143_000)}
    both = ("--max-num-seqs", "32", "--max-num-batched-tokens", "2048")
    (default,) = fits(config(), need, h200)
    (seqs,) = fits(config("--max-num-seqs", "32"), need, h200)
    (fewer,) = fits(config(*both), need, h200)
    assert default.fit_awake == seqs.fit_awake == 1 and fewer.fit_awake == 2, (default.line(), fewer.line())
    # the start-up line says so, with what the vLLM models' args do not set already
    (said,) = say_fit(config(), need, lambda: h200)
    assert said.line().endswith("1 of 10 fit awake at once (2 with --max-num-seqs 32 --max-num-batched-tokens 2048 in "
                                "each vLLM model's args: its CUDA graphs, which stay on the GPU while it is parked, "
                                "then cover batches of up to 64, a step's activations 2,048 tokens)"), said.line()
    (said,) = say_fit(config("--max-num-seqs", "32"), need, lambda: h200)
    assert said.line().endswith("1 of 10 fit awake at once (2 with --max-num-batched-tokens 2048 in each vLLM "
                                "model's args: a step's activations 2,048 tokens)"), said.line()
    (set_already,) = say_fit(config(*both), need, lambda: h200)
    assert set_already.line().endswith("2 of 10 fit awake at once")
    assert with_fewer_seqs(config(*both, "--enforce-eager")) is None


def test_the_first_start_compiles_beside_its_preload_and_starts_once_both_have_ended(caplog):
    """On an H200 the default 8B's start compiled for 36 s and JIT-compiled its sampler for 16 s after its 48.8 s
    preload (vLLM 0.26, empty caches): a server with random weights compiles the same beside the preload, and the
    start loads the compiled code. Only the front's first start: the others load what it compiled. The preloads of
    the next models go on meanwhile."""
    async def main():
        slow = {"ahead_s": 3 * PRELOAD_S}
        s, _, log, spans = switcher(["a", "b", "c"], jobs=2, a=slow, b=slow)
        task = await started(s)
        span = {n: (b, e) for n, b, e in spans}
        assert "compile b" not in span and log[0] == "start a"
        assert span["compile a"][0] < span["a"][1]  # beside a's preload
        assert span["start a"][0] >= span["compile a"][1] and span["start a"][0] >= span["a"][1]
        assert span["b"][0] < span["compile a"][1]  # b's preload did not wait for it
        task.cancel()

    with caplog.at_level("INFO", logger="hotweights.switch"):
        asyncio.run(main())
    assert re.search(r"switch: a ready in [\d.]+ s \(cached, [\d.]+ s; its compile ahead waited for, [\d.]+ s more; "
                     r"started, [\d.]+ s; awake\)", caplog.text), caplog.text


def test_no_compile_ahead_where_the_keeper_holds_the_first_model_or_the_config_turns_it_off(caplog):
    async def main(compile_ahead: bool, already: bool):
        s, _, log, spans = switcher(["a", "b"], jobs=2, compile_ahead=compile_ahead,
                                    a={"ahead_s": PRELOAD_S, "already": already})
        task = await started(s)
        assert log[0] == "start a"
        task.cancel()
        return [n for n, _, _ in spans if n.startswith("compile ")]

    assert asyncio.run(main(True, False)) == ["compile a"]
    assert asyncio.run(main(False, False)) == []  # compile_ahead = false
    assert asyncio.run(main(True, True)) == []  # its start is next: nothing to compile beside


def test_the_compile_ahead_is_off_unless_asked_for(models):
    """Off by default since it lost on an H100 (fill3_h100_2026-12-05c.json: three 8B ready in 181.8 s with it,
    122.9 s without): ``--compile-ahead`` or ``compile_ahead = true`` turns it on, ``--no-compile-ahead`` off."""
    from hotweights import cli, cli_engine, cli_keeper, cli_switch
    from hotweights.switch import config as switch_config

    parser = cli.build_parser(cli_keeper.register, cli_switch.register, cli_engine.register, cli.register)

    def ahead(*flags: str) -> bool:
        args = parser.parse_args(["switch", "--model", f"a={next(iter(models.values()))}", *flags])
        given = {key: getattr(args, key, None) for key in switch_config.SWITCH_KEYS}
        return switch_config.quick(args.models, args.engine, [], given, "gpu").compile_ahead

    assert (ahead(), ahead("--compile-ahead"), ahead("--no-compile-ahead")) == (False, True, False)


def test_no_compile_ahead_where_its_gpu_cannot_hold_it_beside_the_preload(monkeypatch, caplog):
    need = GpuNeed((0,), weights_mib=15_000, loader_only=True, activations_mib=2048)  # preload 17,048 MiB at its
    # peak, the compile too (weights and vLLM's activations)
    assert need.preload_mib(80_000) == need.ahead_mib == 17_048

    def compiled(free_mib: int) -> list[str]:
        on_one_gpu(monkeypatch, 80_000, free_mib)

        async def main() -> list[str]:
            s, _, log, spans = switcher(["a", "b"], jobs=2, need=need, a={"ahead_s": PRELOAD_S})
            task = await started(s)
            task.cancel()
            return [n for n, _, _ in spans if n.startswith("compile ")]
        return asyncio.run(main())

    assert compiled(40_000) == ["compile a"]
    with caplog.at_level("INFO", logger="hotweights.switch"):
        assert compiled(35_000) == []  # 1,024 MiB of it never planned for
    assert "a: not compiled ahead: 35000 MiB of its GPU free, its preload takes 17048 MiB at its peak and the " \
           "compile 17048 MiB beside it" in caplog.text


def test_a_compile_ahead_that_failed_leaves_the_start_to_compile(caplog):
    async def main():
        s, _, log, spans = switcher(["a", "b"], jobs=2, a={"ahead_s": PRELOAD_S, "ahead_fails": True})
        task = await started(s)
        assert log[:1] == ["start a"] and states(s) == {"a": "awake", "b": "parked"}
        task.cancel()

    with caplog.at_level("WARNING", logger="hotweights.switch"):
        asyncio.run(main())
    assert "a: its compile ahead failed (a's compile ahead: its engine exited with code 1 while starting: CUDA " \
           "out of memory); its start compiles" in caplog.text


def test_a_vllm_compile_ahead_is_its_start_with_random_weights_and_a_kv_cache_of_one_sequence(tmp_path, monkeypatch):
    """What changes is outside vLLM's compile-cache key (tests/test_vllm_compile_key.py asks vLLM itself)."""
    from hotweights.demo_model import write_demo_model
    from hotweights.engines.vllm.kvpin import kv_pin
    from hotweights.switch import kinds

    monkeypatch.setattr(kinds, "is_cpu_build", lambda: False)
    model = write_demo_model(tmp_path / "m", "small")
    vllm = KINDS["vllm"]

    def ahead(*args: str, total: int = 143_771):
        return vllm.compile_ahead_command(ModelConfig("v", model, "vllm", args), 8123, True, total)

    args = ("--max-model-len", "512", "--gpu-memory-utilization", "0.25", "--kv-cache-memory-bytes", "2G",
            "--model-loader-extra-config", '{"fallback": false}', "--max-num-seqs", "32")
    cmd, env = ahead(*args)
    start, start_env = vllm.command(ModelConfig("v", model, "vllm", args), 8123, True)
    assert env == start_env  # vLLM's compile-cache key holds some of the environment
    own = cmd[cmd.index("serve") + 1:]
    assert own[:own.index("--load-format")] == [str(model), "--host", "127.0.0.1", "--port", "8123",
                                                "--served-model-name", "v", "--max-model-len", "512",
                                                "--max-num-seqs", "32"]
    pin = kv_pin(model, ["--max-model-len", "512"])
    share = own[own.index("--gpu-memory-utilization") + 1]
    assert own[own.index("--load-format"):] == ["--load-format", "dummy", "--kv-cache-memory-bytes", str(pin),
                                                "--gpu-memory-utilization", share, "--enable-sleep-mode"]
    assert 0 < float(share) < 0.25 and start[-1] == "--enable-sleep-mode"
    assert ahead(*args, "--enforce-eager") is None  # nothing compiled
    assert ahead(*args, "--load-format", "safetensors") is None  # no preload to run beside
    assert ahead(*args, "-tp", "2") is None  # its preload is a whole vLLM start: it compiles
    assert ahead(*args, total=0) is None  # no GPU read
    monkeypatch.setenv("HOTWEIGHTS_VLLM_SERVER_PRELOAD", "1")
    assert ahead(*args) is None
    monkeypatch.setattr(kinds, "is_cpu_build", lambda: True)
    monkeypatch.delenv("HOTWEIGHTS_VLLM_SERVER_PRELOAD")
    assert ahead(*args) is None and KINDS["hotweights"].compile_ahead_command(
        ModelConfig("e", model), 8123, True, 143_771) is None
