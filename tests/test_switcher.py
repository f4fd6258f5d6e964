"""The switch's scheduling, with fake engines (no processes, milliseconds each): start-up order, the batch a switch
serves, which engine parks, ``max_awake`` per GPU, a wake refused for memory, a failed start's back-off, the fair and
fifo schedules, the state table. The real engines behind it: tests/test_switch.py and tests/test_switch_faults.py.

Run: pytest tests/test_switcher.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from pathlib import Path

import pytest

from hotweights.switch.config import ModelConfig, SwitchConfig
from hotweights.switch.upstream.engines import EngineError, WakeRefused
from hotweights.switch.memory import GpuNeed
from hotweights.switch.metrics import SwitchMetrics
from hotweights.switch.states import Failure, FailureKind, InvalidTransition, ModelState, PreloadOutcome, StartState
from hotweights.switch.door import Unavailable
from hotweights.switch.switcher import Switcher


class FakeEngine:
    """An engine that takes ``delay_s`` per start, park and wake, and records them in ``log``."""

    def __init__(self, model: ModelConfig, log: list[str], delay_s: float = 0.001) -> None:
        self.name, self.log, self.delay_s = model.name, log, delay_s
        self.parks, self.log_path, self.running = True, Path("/dev/null"), False
        self.url, self.port, self.server, self.exit_code = "http://fake", 1, 0, None
        self.fail_start: str = ""
        self.refuse_wakes = 0
        self.copy_s = 0.0
        self.file_state = (("model.safetensors", 1, 1),)
        self.need = GpuNeed(())  # none: memory never bounds it (a test gives it one)
        self.keeps_kv = False  # its park keeps no KV cache (a test says it does)
        self.kv_to_host = False  # nor moves one to host memory

    @property
    def pid(self) -> int:
        return 1 if self.running else 0

    def pids(self) -> list[int]:
        return [1] if self.running else []

    def alive(self) -> bool:
        return self.running

    def preload(self) -> PreloadOutcome:
        return PreloadOutcome("cached")

    def host_copy_after(self) -> str:
        return ""  # its weights stay on the GPU (tests/test_preloads.py has a host copy that takes its time)

    def cached_already(self) -> PreloadOutcome | None:
        return None  # a preload runs (tests/test_preloads.py has models the keeper holds already)

    def compiles_ahead(self, total_mib: int) -> bool:
        return False  # nothing to compile (tests/test_preloads.py has a compile that takes its time)

    def compile_ahead(self, total_mib: int) -> float | None:
        return None

    def pin_kv_as(self, other: FakeEngine) -> int:
        return 0  # it profiles nothing (tests/test_preloads.py has engines that learn from a profile)

    compiled_after_s: float | None = None  # its start's log says its code is compiled this long into it (None: never)
    profiled_after_s: float | None = None  # and that its profile of the GPU's memory is done
    _began: float | None = None  # its start going on began

    def compiled(self) -> bool:
        return self._into(self.compiled_after_s)

    def profiled(self) -> bool:
        return self._into(self.profiled_after_s)

    def _into(self, after_s: float | None) -> bool:
        return after_s is not None and self._began is not None and time.monotonic() - self._began >= after_s

    def start(self) -> float:
        self._began = time.monotonic()
        try:
            time.sleep(self.delay_s)
        finally:
            self._began = None
        self.log.append(f"start {self.name}")
        if self.fail_start:
            raise EngineError(f"{self.name}: its engine exited with code 1 while starting: {self.fail_start}")
        self.running = True
        return self.delay_s

    def park(self, level: int, keep: bool = False) -> None:
        time.sleep(self.delay_s)
        self.log.append(f"park {self.name}" + (" keeping its KV cache" if keep else ""))

    def wake(self) -> str:
        if self.refuse_wakes:
            self.refuse_wakes -= 1
            raise WakeRefused(f"{self.name}: would not wake: cannot wake {self.name}: it needs 30.00 GiB back")
        time.sleep(self.delay_s)
        self.log.append(f"wake {self.name}")
        return "kept"

    def weights_to_host(self) -> str:
        return "0 bytes to host memory"

    def host_copy_ahead(self) -> int:
        time.sleep(self.copy_s)
        return 0

    def stop(self) -> None:
        self.running = False

    def files(self) -> tuple[tuple[str, int, int], ...]:
        return self.file_state

    def gpu_need(self) -> GpuNeed:
        return self.need

    def die(self) -> None:
        self.running, self.exit_code = False, -9


def make(names: list[str], totals: dict[int, int] | None = None, **switch) -> tuple[Switcher, dict[str, FakeEngine],
                                                                                 list[str]]:
    """A switcher over fake engines; ``max_awake`` 1 unless given (the cap, so that the tests of switching switch:
    fake engines need no memory, so "auto" keeps them all awake), ``totals`` its GPUs' MiB."""
    switch.setdefault("max_awake", 1)
    log: list[str] = []
    gpus = switch.pop("gpus", {})
    host = switch.pop("host", ())
    models = tuple(ModelConfig(n, Path("/m") / n, gpus=tuple(gpus.get(n, ())), parked_weights="host" if n in host
                               else "gpu") for n in names)
    engines: dict[str, FakeEngine] = {}

    def factory(m: ModelConfig) -> FakeEngine:
        engines[m.name] = FakeEngine(m, log)
        return engines[m.name]

    return Switcher(SwitchConfig(models, **switch), SwitchMetrics(), factory, totals), engines, log


async def started(s: Switcher) -> asyncio.Task:
    task = asyncio.create_task(s.run())
    while not all(m.started for m in s.models.values()) or s.life.busy.locked():
        await asyncio.sleep(0.001)
    return task


async def request(s: Switcher, name: str, hold_s: float = 0.0) -> str:
    m = await s.requests.acquire(name)
    assert m.state in (ModelState.AWAKE, ModelState.LEAVING)  # leaving: its turn ended, it serves what it let in
    await asyncio.sleep(hold_s)
    s.requests.release(m)
    return name


def states(s: Switcher) -> dict[str, str]:
    return {n: m.state.value for n, m in s.models.items()}


def test_a_request_that_comes_while_its_model_starts_keeps_the_cap():
    """Before: start-up made room for b (nothing: it was to park), a request for b came during its start, and b
    stayed awake beside a with ``max_awake = 1``."""
    async def main():
        s, engines, log = make(["a", "b"])
        engines["b"].delay_s = 0.3
        task = asyncio.create_task(s.run())
        while not s.models["b"].started:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.1)  # into its start (0.3 s): past start-up's plan to park it
        assert await request(s, "b") == "b"
        assert states(s) == {"a": "parked", "b": "awake"}, (states(s), log)
        assert log == ["start a", "start b", "park a"], log  # a parked for it before b served
        task.cancel()
    asyncio.run(main())


def test_start_up_leaves_the_default_awake_and_parks_the_others():
    async def main():
        s, _, log = make(["a", "b", "c"])
        task = await started(s)
        assert states(s) == {"a": "awake", "b": "parked", "c": "parked"} and s.life.ready.is_set()
        assert log == ["start a", "start b", "park b", "start c", "park c"]
        task.cancel()
    asyncio.run(main())


def test_start_up_starts_the_host_tier_right_after_the_default_so_their_weights_leave_the_gpu_early():
    async def main():
        s, _, log = make(["a", "b", "c", "d"], host=("d", "b"))
        task = await started(s)
        assert log == ["start a", "start b", "park b", "start d", "park d", "start c", "park c"]
        assert states(s) == {"a": "awake", "b": "deep-parked", "c": "parked", "d": "deep-parked"}
        task.cancel()
    asyncio.run(main())


def test_one_switch_serves_every_request_that_waited_for_it():
    async def main():
        s, _, log = make(["a", "b"])
        task = await started(s)
        log.clear()
        done = await asyncio.gather(*(request(s, "b") for _ in range(8)))
        assert done == ["b"] * 8 and log == ["park a", "wake b"]  # one switch for the batch
        assert s.models["b"].inflight == 0 and s.models["b"].reserved == 0
        task.cancel()
    asyncio.run(main())


def test_an_idle_engine_parks_before_a_busy_one():
    async def main():
        s, _, log = make(["a", "b", "c"], max_awake=2)
        task = await started(s)
        await request(s, "b")  # a and b awake
        busy = asyncio.create_task(request(s, "a", hold_s=0.3))  # a generates on; b idle, less recently used
        await asyncio.sleep(0.01)
        log.clear()
        began = time.monotonic()
        await request(s, "c")
        assert log == ["park b", "wake c"] and time.monotonic() - began < 0.2  # not held by a's request
        await busy
        task.cancel()
    asyncio.run(main())


def test_engines_on_gpus_of_their_own_stay_awake_together_and_one_on_both_parks_both():
    async def main():
        s, _, log = make(["left", "right", "wide"], gpus={"left": [0], "right": [1], "wide": [0, 1]})
        task = await started(s)
        await request(s, "right")
        assert states(s) == {"left": "awake", "right": "awake", "wide": "parked"}
        await request(s, "wide")
        assert states(s) == {"left": "parked", "right": "parked", "wide": "awake"}
        task.cancel()
    asyncio.run(main())


def test_a_wake_refused_for_memory_parks_one_more_engine_and_tries_again():
    async def main():
        s, engines, log = make(["a", "b", "c"], max_awake=2)
        task = await started(s)
        await request(s, "b")
        engines["c"].refuse_wakes = 1
        log.clear()
        await request(s, "c")
        assert log == ["park a", "park b", "wake c"], log  # max_awake made room for one; memory wanted another
        task.cancel()
    asyncio.run(main())


def test_a_failed_start_answers_at_once_until_its_back_off_or_its_files_change():
    async def main():
        s, engines, log = make(["a", "b"])
        engines["b"].fail_start = "no tokenizer"
        task = await started(s)
        assert states(s)["b"] == "failed"
        log.clear()
        for _ in range(3):
            with pytest.raises(Unavailable, match=r"no tokenizer \(tried again in 30 s"):
                await request(s, "b")
        assert log == [] and states(s)["a"] == "awake"  # nothing parked, nothing started again
        engines["b"].fail_start, engines["b"].file_state = "", (("model.safetensors", 2, 2),)
        assert await request(s, "b") == "b" and log == ["park a", "start b"]
        assert s.models["b"].error == "" and s.models["b"].start_failures == 0
        task.cancel()
    asyncio.run(main())


def test_a_start_that_failed_is_tried_again_by_itself_once_its_back_off_is_over(monkeypatch):
    """A default whose start failed (on an H200: vLLM's memory profile upset by another process freeing memory) left
    /health at 503 until a request came, which a health-gated deployment never sends."""
    from hotweights.switch import failures

    monkeypatch.setattr(failures, "BACKOFF_S", 0.2)

    async def main():
        s, engines, log = make(["a", "b"])
        engines["a"].fail_start = engines["b"].fail_start = "Error in memory profiling"
        task = await started(s)
        assert states(s) == {"a": "failed", "b": "failed"}
        engines["a"].fail_start = engines["b"].fail_start = ""
        deadline = time.monotonic() + 5
        while states(s) != {"a": "awake", "b": "parked"}:  # no request: the scheduler tried them again
            assert time.monotonic() < deadline, states(s)
            await asyncio.sleep(0.01)
        assert log.count("start a") == 2 and log.count("start b") == 2 and log[-1] == "park b"
        assert s.models["a"].failure is None and s.models["b"].error == "" and s.models["b"].start_failures == 0
        task.cancel()
    asyncio.run(main())


def test_the_back_off_doubles_with_each_start_that_fails_again():
    async def main():
        s, engines, _ = make(["a", "b"])
        engines["b"].fail_start = "broken"
        task = await started(s)
        m = s.models["b"]
        for expected in (60, 120):
            m.failure = type(m.failure)(m.failure.kind, m.failure.message, 0.0, m.failure.files)  # its back-off is over
            with pytest.raises(Unavailable):
                await request(s, "b")
            assert round(m.failure.retry_at - time.monotonic()) == expected
        task.cancel()
    asyncio.run(main())


def test_an_engine_that_died_starts_again_for_its_next_request():
    async def main():
        s, engines, log = make(["a", "b"])
        task = await started(s)
        engines["a"].die()
        assert await s.engine_gone(s.models["a"]) and states(s)["a"] == "failed"  # moved by the scheduler
        assert s.models["a"].failure.kind is FailureKind.DIED and not s.life.changes.died
        log.clear()
        assert await request(s, "a") == "a" and log == ["start a"]
        task.cancel()
    asyncio.run(main())


async def _queue_behind_a_slow_switch(s: Switcher, engines: dict[str, FakeEngine], log: list[str],
                                      gap_s: float) -> list[str]:
    """While a switch to ``d`` (slow) goes on, one request for b comes, then (``gap_s`` later) three for c: which
    does the scheduler switch to next?"""
    engines["d"].delay_s = 0.06
    slow = asyncio.create_task(request(s, "d"))
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(request(s, "b"))]
    await asyncio.sleep(gap_s)
    waiting += [asyncio.create_task(request(s, "c")) for _ in range(3)]
    log.clear()
    await asyncio.gather(slow, *waiting)
    return [x for x in log if x.startswith("wake") and x != "wake d"]


def test_fair_serves_the_model_most_requests_wait_for_first_and_fifo_the_first_come():
    async def main(schedule: str) -> list[str]:
        s, engines, log = make(["a", "b", "c", "d"], schedule=schedule)
        task = await started(s)
        woken = await _queue_behind_a_slow_switch(s, engines, log, 0.005)
        task.cancel()
        return woken
    assert asyncio.run(main("fair")) == ["wake c", "wake b"]  # three wait for c, one for b
    assert asyncio.run(main("fifo")) == ["wake b", "wake c"]  # b's request came first


def test_fair_serves_a_starving_model_first():
    async def main():
        s, engines, log = make(["a", "b", "c", "d"], starve_after_s=0.02)
        task = await started(s)
        assert await _queue_behind_a_slow_switch(s, engines, log, 0.03) == ["wake b", "wake c"]
        task.cancel()
    asyncio.run(main())


def test_a_request_for_a_model_start_up_has_not_reached_moves_it_ahead_and_keeps_it_awake():
    async def main():
        s, engines, log = make(["a", "b", "c"])
        for e in engines.values():
            e.delay_s = 0.02
        task = asyncio.create_task(s.run())
        while not s.models["a"].started:
            await asyncio.sleep(0.001)
        assert await request(s, "c") == "c"
        assert log[:3] == ["start a", "park a", "start c"], log  # before b, and awake for it: room made first
        while not s.models["b"].started or s.life.busy.locked():
            await asyncio.sleep(0.001)
        assert states(s) == {"a": "parked", "b": "parked", "c": "awake"}
        task.cancel()
    asyncio.run(main())


def test_a_request_that_waits_too_long_gets_a_503_and_never_another_models_engine():
    async def main():
        s, engines, _ = make(["a", "b"], request_timeout_s=0.05)
        task = await started(s)
        engines["b"].delay_s = 0.2
        with pytest.raises(Unavailable, match="was not awake within"):
            await request(s, "b")
        assert s.models["b"].waiting == 0 and s.models["a"].inflight == 0
        while states(s)["b"] != "awake":  # the switch it waited for went on
            await asyncio.sleep(0.01)
        task.cancel()
    asyncio.run(main())


def test_a_move_the_table_does_not_have_is_refused():
    async def main():
        s, _, _ = make(["a"])
        with pytest.raises(InvalidTransition, match="a: starting -> starting"):
            s.life.move(s.models["a"], ModelState.STARTING)
        s.life.move(s.models["a"], ModelState.STOPPED)
        with pytest.raises(InvalidTransition, match="stopped -> awake"):
            s.life.move(s.models["a"], ModelState.AWAKE)
        # review f, move 3: a failure comes with the move to FAILED, and only with it; every other move clears it
        with pytest.raises(InvalidTransition, match="needs its failure"):
            s.life.move(s.models["a"], ModelState.FAILED)
        died = Failure(FailureKind.DIED, "its engine exited")
        with pytest.raises(InvalidTransition, match="only a failed model has a failure"):
            s.life.move(s.models["a"], ModelState.STARTING, died)
        s.life.move(s.models["a"], ModelState.FAILED, died)
        assert s.models["a"].error == "its engine exited"
        s.life.move(s.models["a"], ModelState.STARTING)
        assert s.models["a"].failure is None and s.models["a"].error == ""
    asyncio.run(main())


def test_the_default_serves_while_its_host_copy_is_made_ahead():
    """``parked_weights = "host"``: the default's host copy (seconds for an 8B) is made after it is ready."""
    async def main():
        s, engines, _ = make(["a", "b"], host=("a",))
        engines["a"].copy_s = 0.3
        task = asyncio.create_task(s.run())
        began = time.monotonic()
        await asyncio.wait_for(s.life.ready.wait(), 5)
        assert time.monotonic() - began < 0.2 and s.life.busy.locked()  # ready, the copy still going
        task.cancel()
    asyncio.run(main())


GIB = 1024


def on_gpu(engines: dict[str, FakeEngine]) -> None:
    """Give every fake engine an 8B vLLM model's need on GPU 0: weights 15 GiB kept on it, 20 GiB of its own while
    awake (KV cache, activations), 1.9 GiB parked: 36.9 GiB awake, 16.9 GiB parked."""
    for e in engines.values():
        e.need = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950)


H200 = {0: 140 * GIB}


async def load(s: Switcher, names: list[str], rounds: int, hold_s: float) -> list[float]:
    """``rounds`` rounds of one request per model at once, each held ``hold_s``: every request's wait for its model."""
    waits: list[float] = []

    async def one(name: str) -> None:
        began = time.monotonic()
        m = await s.requests.acquire(name)
        waits.append(time.monotonic() - began)
        await asyncio.sleep(hold_s)
        s.requests.release(m)

    for _ in range(rounds):
        await asyncio.gather(*(one(n) for n in names))
    return waits


def test_under_steady_load_every_engine_that_fits_stays_awake_as_static_partitioning_would():
    """Issue 52's ping-pong: three 8B engines that fit an H200 awake took turns, one awake at a time, each turn
    costing a 2 s wait behind a busy engine. With memory bounding the awake set, each wakes once and stays."""
    async def main():
        s, engines, log = make(["a", "b", "c"], H200, max_awake="auto")
        on_gpu(engines)
        task = await started(s)
        log.clear()
        waits = await load(s, ["a", "b", "c"], rounds=10, hold_s=0.02)
        assert log == ["wake b", "wake c"], log  # each woke once, beside the others; nothing parked
        assert states(s) == {"a": "awake", "b": "awake", "c": "awake"}
        assert sorted(waits)[-3] < 0.05, sorted(waits)[-5:]  # after the two wakes, no request waits for a switch
        task.cancel()
    asyncio.run(main())


def test_the_engines_a_wake_parks_for_it_park_at_once():
    """Each park is a call to its own engine (11-37 ms on an H200): a wake that parked five waited for each in turn."""
    async def main():
        s, engines, log = make(["a", "b", "c", "d"], H200, max_awake="auto")
        on_gpu(engines)
        engines["d"].need = GpuNeed((0,), 0.0, 15 * GIB, 60 * GIB, parked_mib=1950)  # awake beside one of them
        task = await started(s)
        for name in "abc":  # (d's start parked a)
            await request(s, name)
        assert states(s) == {"a": "awake", "b": "awake", "c": "awake", "d": "parked"}
        spans: dict[str, tuple[float, float]] = {}

        def timed(e: FakeEngine):
            park = e.park

            def parked(level: int, keep: bool = False) -> None:
                began = time.monotonic()
                park(level, keep)
                spans[e.name] = (began, time.monotonic())
            return parked

        for name in "abc":
            engines[name].park, engines[name].delay_s = timed(engines[name]), 0.2
        await request(s, "d")
        assert len(spans) >= 2 and states(s)["d"] == "awake", (spans, states(s))
        assert max(b for b, _ in spans.values()) < min(e for _, e in spans.values()), spans  # side by side
        task.cancel()
    asyncio.run(main())


def test_a_request_that_comes_as_a_wake_parks_its_idle_engine_waits_for_its_next_wake():
    """Between the plan's parks and each park's task beginning, the loop runs what is ready: a request that came then
    found its engine awake and idle, went in, and reached it asleep (a 503 from the engine, seen once under Ray)."""
    from hotweights.switch.schedule import Room

    async def main():
        s, engines, _log = make(["a", "b"])
        task = await started(s)
        await request(s, "a")  # a awake and idle, b parked
        inflight_at_park: list[int] = []
        park = engines["a"].park

        def parked(level: int, keep: bool = False) -> None:
            inflight_at_park.append(s.models["a"].inflight)
            park(level, keep)
        engines["a"].park = parked
        async with s.life.busy:  # as the scheduler holds it
            switching = asyncio.create_task(s.life.switch_to(s.models["b"], Room(park=("a",))))
            came = asyncio.create_task(request(s, "a"))  # runs right after the switch's first step
            await switching
            assert states(s) == {"a": "parked", "b": "awake"} and not came.done()
        assert await asyncio.wait_for(came, 5) == "a"  # the scheduler woke a again for it
        assert inflight_at_park == [0]
        task.cancel()
    asyncio.run(main())


def test_a_wake_that_needs_memory_parks_the_least_recently_used_idle_engine_first():
    async def main():
        s, engines, log = make(["a", "b", "c"], {0: 100 * GIB}, max_awake="auto")  # two awake, one parked fit
        on_gpu(engines)
        task = await started(s)
        await request(s, "b")
        assert states(s) == {"a": "awake", "b": "awake", "c": "parked"}
        busy = asyncio.create_task(request(s, "b", hold_s=0.3))  # b busy and the most recent: a is idle, older
        await asyncio.sleep(0.01)
        log.clear()
        began = time.monotonic()
        await request(s, "c")
        assert log == ["park a", "wake c"] and time.monotonic() - began < 0.2, log  # not b, and not held by it
        await request(s, "a")  # now b (idle once its request ends, else c's turn...) or c: the idle, older one
        await busy
        assert states(s)["a"] == "awake" and list(states(s).values()).count("awake") == 2, states(s)
        task.cancel()
    asyncio.run(main())


def test_where_memory_forces_a_choice_between_busy_engines_each_gets_a_bounded_turn_and_none_starves():
    async def main():
        s, engines, log = make(["a", "b"], {0: 60 * GIB}, max_awake="auto", turn_s=0.1)  # one awake at a time
        on_gpu(engines)
        task = await started(s)
        stop = time.monotonic() + 1.5
        waits: dict[str, list[float]] = {"a": [], "b": []}

        async def client(name: str) -> None:  # back to back: its engine is never idle
            while time.monotonic() < stop:
                began = time.monotonic()
                m = await s.requests.acquire(name)
                waits[name].append(time.monotonic() - began)
                await asyncio.sleep(0.05)
                s.requests.release(m)

        await asyncio.gather(*(client(n) for n in ("a", "a", "b", "b")))
        served = {n: len(w) for n, w in waits.items()}
        assert min(served.values()) >= 5, served  # both served: neither starved
        assert max(max(w) for w in waits.values()) < 0.6, waits  # a turn: 0.1 s x 2 in flight, then the drain
        assert log.count("wake a") >= 2 and log.count("wake b") >= 2, log  # turns, not one model throughout
        task.cancel()
    asyncio.run(main())


def test_the_engine_that_leaves_parks_even_when_the_model_after_it_parked_first():
    """Issue 52's overlap bug (fails before the fix): a woke beside busy b... here b woke beside busy a after its
    turn, then c's request parked b, and a, left to park once its request ended "for b", never parked: two engines
    awake past max_awake = 1 until the next switch."""
    async def main():
        s, _, _ = make(["a", "b", "c"])  # max_awake 1
        task = await started(s)
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, sum(m.state in (ModelState.AWAKE, ModelState.LEAVING) for m in s.models.values()))
                await asyncio.sleep(0.002)

        watching = asyncio.create_task(watch())
        busy = asyncio.create_task(request(s, "a", hold_s=2.5))  # longer than the 2 s overlap of before
        await asyncio.sleep(0.01)
        for_b = asyncio.create_task(request(s, "b"))
        await asyncio.sleep(2.2)  # before: b awake beside a at 2 s
        await request(s, "c")
        await asyncio.gather(busy, for_b)
        await asyncio.sleep(0.1)
        assert [n for n, st in states(s).items() if st == "awake"] == ["c"], states(s)
        assert most == 1, most
        watching.cancel()
        task.cancel()
    asyncio.run(main())


def test_room_for_parks_idle_engines_first_then_waits_for_turns_as_a_table():
    """Review f, move 1: ``room_for`` is a function of a snapshot's views alone (no engine, no clock): each row is
    one situation and what makes room for c."""
    from hotweights.switch.schedule import room_for
    from hotweights.switch.snapshot import Snapshot, View

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "abcd"), max_awake="auto", turn_s=1.0)
    need = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950)  # as ``on_gpu``: room for two awake of 112 GiB
    now = 1000.0

    def room(a_inflight=0, b_inflight=0, waited=()):
        views = (View(config.models[0], ModelState.AWAKE, need, inflight=a_inflight, last_used=1.0),
                 View(config.models[1], ModelState.AWAKE, need, inflight=b_inflight, last_used=2.0),
                 View(config.models[2], ModelState.PARKED, need, waiting=len(waited),
                      arrivals=tuple(now - w for w in waited)),
                 View(config.models[3], ModelState.PARKED, need))
        s = Snapshot(views, {0: 112 * GIB}, now, "a")
        return room_for(s["c"], s, config)

    assert room().park == ("a",)  # the least recently used idle one
    r = room(1, 1, (0.4,))  # both busy: c waits for a turn to end
    assert r.wait and not r.park and not r.leave and abs(r.look_in_s - 0.6) < 1e-9, r
    r = room(1, 1, (0.7, 0.4))  # 1.1 request-seconds waited: a turn of one request ends
    assert r.wait and len(r.leave) == 1 and not r.park, r
    assert room(1, 3, (0.7, 0.4)).leave == ("a",)  # b owes more: a leaves
    assert room(1, 3, (20,)).leave == ("a",)  # starving: whatever is in flight
    assert room(0, 1, (0.4,)).park == ("a",)  # an idle one parks before any turn ends


def test_the_deadline_schedule_serves_the_first_due_and_ends_a_turn_by_it_never_shorter_than_a_wake():
    """Issue 69, part 2, as a table over views: with ``schedule = "deadline"`` the model whose request is due first
    goes next (a first token ``slo_ttft_s`` after its request; a held stream's next token when its due says), and a
    busy engine's turn ends once that due time less the model's wake has come, not before the busy engine has been
    awake as long as the round trip takes: its park, the model's wake and park, its own wake (its own wake alone, a
    GPU tier's 15 ms, let every host-tier due end a GPU-tier turn; the two wakes alone, with one engine awake at a
    time and every stream late, ended each turn before its first step)."""
    from hotweights.switch.schedule import room_for, wanted
    from hotweights.switch.turns import due, turn_left_s
    from hotweights.switch.snapshot import Snapshot, View

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "abcd"), max_awake="auto",
                          schedule="deadline", slo_ttft_s=2.0, slo_token_s=0.1, first_token_s=0.4)
    need = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950)  # room for two awake of 112 GiB
    now = 1000.0

    def view(name, state="parked", inflight=0, waited=(), dues=(), awake_for=10.0, wake_s=None, park_s=0.05):
        return View(config.models["abcd".index(name)], ModelState(state), need, inflight=inflight,
                    waiting=len(waited), arrivals=tuple(now - w for w in waited),
                    dues=dues or (None,) * len(waited), awake_at=now - awake_for, wake_s=wake_s, park_s=park_s)

    held = view("c", waited=(0.1,), dues=(now + 0.3,), wake_s=0.2)  # a held stream: its next token in 0.3 s
    fresh = view("d", waited=(1.0,), wake_s=0.2)  # a new request that came 1 s ago: its first token in 1 s
    assert due(held, config, now) == now + 0.3 and abs(due(fresh, config, now) - (now + 0.6)) < 1e-9  # awake 0.4 s
    # before
    s = Snapshot((view("a", "awake", 1), view("b", "awake", 1), held, fresh), {0: 112 * GIB}, now, "a")
    assert [v.name for v in wanted(s, config)] == ["c", "d"]  # the first due first, not the most or longest waiting
    assert abs(turn_left_s(s["a"], held, config, now) - 0.05) < 1e-9  # due in 0.3 s, its wake 0.2 s, a's park 0.05
    assert abs(turn_left_s(s["a"], fresh, config, now) - 0.35) < 1e-9
    # on an H100, with the wake alone counted, 46 of 173 first tokens came 0-1.2 s past 2 s: the leave, the wake
    # and the prefill all go before a first token
    alone = dataclasses.replace(config, first_token_s=0.0)
    assert abs(turn_left_s(view("a", "awake", 1, park_s=None), fresh, alone, now) - 0.7) < 1e-9  # a guessed park
    just_woke = view("a", "awake", 1, awake_for=0.05, wake_s=0.4)  # awake 0.05 s of a wake that took 0.4 s
    assert abs(turn_left_s(just_woke, held, config, now) - 0.65) < 1e-9  # never shorter than the round trip: its
    # park, c's wake and park, its own wake (0.05 + 0.2 + 0.05 + 0.4)
    gpu_tier = view("a", "awake", 1, awake_for=0.5, wake_s=0.015)  # a GPU-tier engine, for a host-tier wake of 1 s
    assert abs(turn_left_s(gpu_tier, view("d", waited=(1.9,), wake_s=1.0), config, now) - 0.615) < 1e-9
    late = view("c", waited=(0.1,), dues=(now - 0.2,))  # overdue: the busy engine's turn is over now
    s = Snapshot((view("a", "awake", 1), view("b", "awake", 2), late, view("d")), {0: 112 * GIB}, now, "a")
    assert room_for(s["c"], s, config).leave == ("a",)
    assert due(view("d"), config, now) == math.inf  # nothing waits: never due
    # past its deadline by more than a token's (or a first token's) margin: it has missed Aegaeon's SLO, and is due
    # slo_ttft_s later, after a first token due sooner (on time yet)
    missed = view("c", waited=(3.0,), dues=(now - 0.5,))
    assert due(missed, config, now) == now + 1.5
    s = Snapshot((view("a", "awake", 1), view("b", "awake", 1), missed, fresh), {0: 112 * GIB}, now, "a")
    assert [v.name for v in wanted(s, config)] == ["d", "c"]


def test_of_busy_engines_whose_turn_is_over_the_one_whose_streams_can_wait_longest_leaves():
    """Issue 69: which busy engine leaves for a model due decides whose streams pause, and a stream paused with no
    slack misses its next token by Aegaeon's deadline (its first token's time and ``slo_token_s`` a token since),
    where one that ran ahead of its deadline does not. With the deadline schedule, of the engines whose turn is over
    the one whose streams' next tokens are due last leaves (before: the least recently used)."""
    from hotweights.switch.schedule import room_for
    from hotweights.switch.snapshot import Snapshot, View
    from hotweights.switch.turns import slack_s, token_due

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "abcd"), max_awake="auto",
                          schedule="deadline", slo_ttft_s=2.0, slo_token_s=0.1, first_token_s=0.4)
    need, now = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950), 1000.0  # two awake fit 112 GiB
    fresh = ((now - 0.5, now - 0.2, 2),)  # its first token 0.2 s ago, two tokens: the third due now
    ahead = ((now - 3.0, now - 2.5, 100), (now - 1.0, 0.0, 0))  # 100 tokens in 2.5 s; one in its prefill
    assert abs(token_due(*fresh[0], config) - (now - 0.1)) < 1e-9  # its engine awake one token's time before
    assert abs(token_due(*ahead[1], config) - (now + 0.6)) < 1e-9  # its first token due 2 s after, awake 0.4 before

    def busy(name, clocks, last_used):
        return View(config.models["abc".index(name)], ModelState.AWAKE, need, inflight=len(clocks),
                    last_used=last_used, clocks=clocks, awake_at=now - 10, park_s=0.05)

    late = View(config.models[2], ModelState.PARKED, need, waiting=1, arrivals=(now - 1.9,), dues=(now - 0.3,),
                wake_s=0.3)  # a held stream, late already
    idle = View(config.models[3], ModelState.PARKED, need)
    for a_clocks, b_clocks, leaves in ((fresh, ahead, "b"), (ahead, fresh, "a")):
        s = Snapshot((busy("a", a_clocks, 1.0), busy("b", b_clocks, 2.0), late, idle), {0: 112 * GIB}, now, "a")
        assert room_for(s["c"], s, config).leave == (leaves,), (a_clocks, b_clocks)
    assert slack_s(busy("a", ahead, 1.0), config, now) == pytest.approx(0.6)
    assert slack_s(busy("a", (), 1.0), config, now) == math.inf
    fair = dataclasses.replace(config, schedule="fair", turn_s=0.0)  # the other schedules: the least recently used
    s = Snapshot((busy("a", fresh, 1.0), busy("b", ahead, 2.0), late, idle), {0: 112 * GIB}, now, "a")
    assert room_for(s["c"], s, fair).leave == ("a",)


def test_where_one_leave_makes_room_the_deadline_schedule_takes_the_first_in_turn_order_not_the_largest():
    """Issue 69, from an H100 run (five 8B, ``max_awake 2``, 0.5 req/s): 14 of 78 leaves were a host-tier engine's
    (13 streams held, a wake back of 0.34 s) for a GPU-tier model that needed only a place under the cap, where the
    other awake engine, GPU-tier (2-3 streams, a wake back of 7 ms), would have done: the busy engines that free the
    most memory left first. With the deadline schedule, where one leave makes room, the first in turn order does
    (its streams' slack less its own wake back, the most first), holding its streams where that fits; memory still
    decides where only one of them frees enough."""
    from hotweights.switch.schedule import room_for
    from hotweights.switch.snapshot import Snapshot, View

    host = {"h", "x"}
    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n, parked_weights="host" if n in host else "gpu")
                                for n in "hgwx"), max_awake=2, schedule="deadline", slo_ttft_s=2.0, slo_token_s=0.1,
                          first_token_s=0.4)
    need, now = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950), 1000.0
    crowded = tuple((now - 1.5, now - 1.0, 12) for _ in range(13))  # 13 streams, each due awake 0.1 s hence
    ahead = tuple((now - 3.0, now - 2.5, 100) for _ in range(2))  # 2 streams, 7.4 s of slack

    def snap(total_gib, waiting):
        views = [View(config.models[0], ModelState.AWAKE, need, inflight=13, clocks=crowded, can_hold=True,
                      awake_at=now - 10, wake_s=0.34, park_s=0.07, last_used=1.0),
                 View(config.models[1], ModelState.AWAKE, need, inflight=2, clocks=ahead, can_hold=True,
                      awake_at=now - 10, wake_s=0.007, park_s=0.011, last_used=2.0)]
        for i, name in ((2, "w"), (3, "x")):  # a held stream each, overdue
            views.append(View(config.models[i], ModelState.PARKED, need, waiting=int(name == waiting),
                              arrivals=(now - 1.0,) if name == waiting else (),
                              dues=(now - 0.2,) if name == waiting else (), wake_s=0.3))
        return Snapshot(tuple(views), {0: total_gib * GIB}, now, "h")

    s = snap(200, "w")  # memory to spare: only the cap wants a place
    r = room_for(s["w"], s, config)
    assert (r.leave, r.keep) == (("g",), ("g",)), r
    fair = dataclasses.replace(config, schedule="fair", turn_s=0.0)
    assert room_for(s["w"], s, fair).leave == ("h",)  # the other schedules: the most memory freed first
    s = snap(115, "x")  # a host-tier wake that g's held park would not make room for: h leaves, holding
    r = room_for(s["x"], s, config)
    assert (r.leave, r.keep) == (("h",), ("h",)), r


def test_a_busy_engine_keeps_its_turn_for_a_first_token_while_its_streams_lack_slack_for_the_pause():
    """Issue 69, from an H100 run (five 8B, ``max_awake 2``, 0.5 req/s): 20 of 51 misses of Aegaeon's SLO were streams
    paused with under 1 s of slack, most within their first 11 tokens, for pauses of 0.3-1.8 s: their next token
    late whatever came after. With the deadline schedule a busy engine whose streams have less slack than their
    pause would take at least (``away_s``: its park, the model's wake and shortest turn, the model's park, its own
    wake) keeps its turn for a model due for a first token (Aegaeon's bound for it is 10 s), until they have it or
    are past their deadline (the scheduler looks again then), for at most that pause past the model's due; not for a
    held stream's next token."""
    from hotweights.switch.snapshot import View
    from hotweights.switch.turns import away_s, turn_left_s

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "ab"), max_awake="auto",
                          schedule="deadline", slo_ttft_s=2.0, slo_token_s=0.1, first_token_s=0.4)
    need, now = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB), 1000.0

    def busy(*clocks):  # a GPU-tier engine, awake 10 s
        return View(config.models[0], ModelState.AWAKE, need, inflight=len(clocks), clocks=clocks,
                    awake_at=now - 10, wake_s=0.015, park_s=0.05)

    def waiting(waited, held=False):  # a host-tier model: a request, or a held stream due 2 s after it came
        return View(config.models[1], ModelState.PARKED, need, waiting=1, arrivals=(now - waited,),
                    dues=(now - waited + 1.6,) if held else (None,), wake_s=0.3, park_s=0.05)

    fresh = busy((now - 0.5, now - 0.2, 5))  # its next token due 0.3 s hence, its engine awake 0.2 s hence
    ahead = busy((now - 3.0, now - 2.5, 37))  # 37 tokens in 2.5 s: 1.1 s of slack (not far ahead: 1.73 s)
    assert away_s(fresh, waiting(1.0)) == pytest.approx(0.05 + 0.6 + 0.05 + 0.03)
    due_in = waiting(1.0)  # its first token due 1 s hence: awake 0.6 s hence, the turn's end 0.25 s hence
    assert turn_left_s(ahead, due_in, config, now) == pytest.approx(0.25)
    # 0.2 s of slack where the pause takes 0.73 s: kept until its stream's deadline, where its next token has come
    # (more slack, looked at again) or not (late: no more keep)
    assert turn_left_s(fresh, due_in, config, now) == pytest.approx(0.3)
    assert turn_left_s(busy((now - 3.0, now - 0.1, 6)), due_in, config, now) == pytest.approx(0.73 - 0.4)
    # a stream queued behind another, its first token's deadline 0.01 s hence: kept no longer (on the CPU, 4 s)
    assert turn_left_s(busy((now - 1.99, 0.0, 0)), due_in, config, now) == pytest.approx(0.25)
    overdue = waiting(1.9)  # the turn's end was 0.65 s ago: kept 0.73 s past it at most
    assert turn_left_s(ahead, overdue, config, now) == 0.0
    assert turn_left_s(fresh, overdue, config, now) == pytest.approx(0.73 - 0.65)
    assert turn_left_s(fresh, waiting(2.5), config, now) == 0.0  # past that: the turn ends
    assert turn_left_s(fresh, waiting(1.9, held=True), config, now) == 0.0  # a held stream's token: no keep
    assert turn_left_s(busy(), overdue, config, now) == 0.0  # nothing in flight that may pause
    # a stream past its deadline has missed Aegaeon's SLO already: a pause costs it nothing more (on the CPU, where
    # a queued stream was late from its start, a kept turn let it finish before the model it was held for)
    late = busy((now - 3.0, now - 2.5, 2))  # its third token was due 2.3 s ago (behind, not far ahead)
    assert turn_left_s(late, due_in, config, now) == pytest.approx(0.25)
    assert turn_left_s(busy((now - 3.0, now - 2.5, 2), (now - 0.5, now - 0.2, 5)), due_in, config, now) > 0.25


def test_a_busy_engine_far_ahead_of_its_deadlines_ends_its_turn_before_the_waiting_model_is_due():
    """Issue 69, from ``benchmarks/switch_sim.py`` (ten 8B on an H200 at 0.1 req/s, two awake: Aegaeon's SLO 96.2% ->
    99.0%): with the deadline schedule a busy engine whose streams all may pause and have the slack for their pause
    and ``AHEAD_S`` more ends its turn for a waiting model at once, not at its due, once it has been awake as long as
    the two wakes take; one with a request that may not pause, or with less slack, keeps it until then; so does every
    engine with the fair schedule."""
    from hotweights.switch.snapshot import View
    from hotweights.switch.turns import AHEAD_S, away_s, far_ahead, slack_s, turn_left_s

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "ab"), max_awake=2,
                          schedule="deadline", slo_ttft_s=10.0, slo_token_s=0.1, first_token_s=0.4)
    need, now = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB), 1000.0

    def busy(tokens, awake_s=10.0, inflight=1):  # one stream, its first token 2.5 s ago
        return View(config.models[0], ModelState.AWAKE, need, inflight=inflight,
                    clocks=((now - 3.0, now - 2.5, tokens),), awake_at=now - awake_s, wake_s=0.015, park_s=0.05)

    waiting = View(config.models[1], ModelState.PARKED, need, waiting=1, arrivals=(now - 1.0,), dues=(None,),
                   wake_s=0.3, park_s=0.05)  # its first token due 8.6 s hence: its turn 8.25 s hence
    away = away_s(busy(100), waiting)
    assert away == pytest.approx(0.05 + 0.6 + 0.05 + 0.03)
    far = busy(100)  # 100 tokens in 2.5 s: 7.4 s of slack
    assert far_ahead(far, waiting, slack_s(far, config, now)) and turn_left_s(far, waiting, config, now) == 0.0
    assert turn_left_s(busy(100, awake_s=0.1), waiting, config, now) == pytest.approx(0.315 - 0.1)  # the two wakes
    late = busy(2)  # every stream late: behind, not ahead
    assert not far_ahead(late, waiting, slack_s(late, config, now))
    assert turn_left_s(late, waiting, config, now) == pytest.approx(8.25)
    # behind, it keeps its turn for the round trip at least (its park, b's wake and park, its own wake), not the two
    # wakes alone: one engine awake at a time, such turns ended before their first step
    overdue = dataclasses.replace(waiting, arrivals=(now - 20.0,))
    assert turn_left_s(busy(2, awake_s=0.1), overdue, config, now) == pytest.approx(0.415 - 0.1)
    assert turn_left_s(busy(100, awake_s=0.1), overdue, config, now) == pytest.approx(0.315 - 0.1)
    near = busy(int((away + AHEAD_S + 2.5) * 10) - 1)  # a token short of the slack
    assert not far_ahead(near, waiting, slack_s(near, config, now))
    assert turn_left_s(near, waiting, config, now) == pytest.approx(8.25)
    unpausable = busy(100, inflight=2)  # a request that may not pause
    assert not far_ahead(unpausable, waiting, slack_s(unpausable, config, now))
    fair = dataclasses.replace(config, schedule="fair")
    assert turn_left_s(far, waiting, fair, now) == turn_left_s(near, waiting, fair, now)


def test_requests_on_their_way_to_the_engine_count_by_their_first_tokens(tmp_path):
    """Issue 69: a request let in at a wake is in flight at once, but its stream joins its model's (its clock known)
    only once the engine's answer begins. Until then it counts by its first token (``View.coming``): an engine just
    woken for new requests has slack, not none on time (then it was sent away as if behind). The model's view lists
    them: requests let in and not yet taken up (an awake model's waiting ones; a held stream's, with its due, joins
    at once) and streams that took their place and wait for the engine's answer (a weak set: one that never joins
    goes with its request)."""
    import gc

    from hotweights.switch.model import Model
    from hotweights.switch.preempt import COMPLETIONS, resumable
    from hotweights.switch.snapshot import View
    from hotweights.switch.turns import slack_s
    from hotweights.switch.upstream.engines import Engine

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "ab"), schedule="deadline", preempt=True,
                          slo_ttft_s=2.0, slo_token_s=0.1, first_token_s=0.4)
    need, now = GpuNeed((0,), 0.0, 15 * GIB, 2 * GIB), 1000.0
    woken = View(config.models[0], ModelState.AWAKE, need, inflight=1, coming=(now - 0.5,), awake_at=now)
    assert slack_s(woken, config, now) == pytest.approx(1.1)  # due 1.6 s after it came
    assert slack_s(dataclasses.replace(woken, coming=()), config, now) == math.inf  # as if none were on time
    assert slack_s(dataclasses.replace(woken, coming=(now - 2.5,)), config, now) == math.inf  # late already

    m = Model(config.models[0], Engine(config.models[0], tmp_path), state=ModelState.AWAKE)
    new, held = m.ledger.arrive(), m.ledger.arrive(due=now)
    r = resumable(COMPLETIONS, b'{"model": "a", "prompt": "x", "max_tokens": 5, "stream": true}')
    r.arrived = new - 0.01
    m.entering.add(r)
    assert m.view().coming == (new, new - 0.01) and held not in m.view().coming
    m.state = ModelState.LEAVING  # its waiting requests wait for its next wake: not in flight
    assert m.view().coming == (new - 0.01,)
    del r
    gc.collect()
    assert m.view().coming == ()


def test_an_engine_ahead_of_its_deadlines_leaves_the_gpus_time_to_one_short_of_slack_beside_it():
    """Issue 69, from ``benchmarks/switch_sim.py`` (engines awake together share the GPU: each decode step reads its
    whole weights). With the deadline schedule, an awake engine whose streams lack the slack for one pause of their
    own is short of it, and gets the GPU's time first: an awake engine beside it whose streams can hold and have the
    slack for its own round trip twice and the other's once leaves, holding them (``Leave.ahead``: for the other's
    streams, not for a waiting model), and a model waited for by held streams whose next tokens are not due yet wakes
    beside it at its due less its wake, not at once. Not with the fair schedule, nor for an engine that cannot hold,
    nor across GPUs, nor for a first token, nor for one with a request in flight that is not a stream that may pause
    (yet). With streams in flight the deadline schedule looks again a token's time hence: their slack changes with
    the clock, and no event says so."""
    from hotweights.switch.schedule import Leave, Wait, Wake, plan
    from hotweights.switch.snapshot import Snapshot, View
    from hotweights.switch.turns import not_due_s, short_of_slack

    def config(schedule="deadline", gpus=((), ())):
        return SwitchConfig(tuple(ModelConfig(n, Path("/m") / n, gpus=g) for n, g in zip("abc", (*gpus, ()))),
                            schedule=schedule, preempt=True, slo_ttft_s=2.0, slo_token_s=0.1, first_token_s=0.4)

    need, now = GpuNeed((0,), 0.0, 15 * GIB, 2 * GIB), 1000.0

    def awake(c, i, clock, can_hold=True, wake_s=0.015):
        return View(c.models[i], ModelState.AWAKE, need, inflight=1, clocks=(clock,), can_hold=can_hold,
                    awake_at=now - 10, wake_s=wake_s, park_s=0.05)

    def snapshot(c, a_clock, b_clock, can_hold=True, c_due=None):
        views = [awake(c, 0, a_clock, wake_s=0.3), awake(c, 1, b_clock, can_hold)]
        if c_due is not None:  # c parked: a request (c_due 0) or a held stream due c_due s hence
            views.append(View(c.models[2], ModelState.PARKED, need, waiting=1, arrivals=(now - 0.1,),
                              dues=(now + c_due if c_due else None,), wake_s=0.3, park_s=0.05))
        else:
            views.append(View(c.models[2], ModelState.PARKED, need, wake_s=0.3, park_s=0.05))
        return Snapshot(tuple(views), {}, now, "a")

    short = (now - 0.5, now - 0.2, 2)  # a's next token due now: no slack for its pause (1.3 s: a host-tier wake's)
    ahead = (now - 3.0, now - 2.5, 100)  # b: 7.4 s of slack, its round trip twice and a's once 2.19 s
    deadline = config()
    p = plan(snapshot(deadline, short, ahead), deadline)
    assert p.leave == (Leave("b", "a", 0, True, ahead=True),) and p.then == Wait(0.1), p  # slack looked at again
    assert plan(snapshot(deadline, short, (now - 3.0, now - 2.0, 31)), deadline).leave == ()  # 1 s of slack
    assert plan(snapshot(deadline, short, ahead, can_hold=False), deadline).leave == ()
    # a request let in at b's wake whose stream has not begun (no clock yet) would end in flight, b leaving: on an
    # H100 such leaves held an awake place 0.1-7.7 s, 43 s in a run
    s = snapshot(deadline, short, ahead)
    let_in = dataclasses.replace(s, models=tuple(dataclasses.replace(v, inflight=2) if v.name == "b" else v
                                                 for v in s.models))
    assert plan(let_in, deadline).leave == ()
    assert plan(snapshot(deadline, ahead, ahead), deadline).leave == ()  # none short of slack
    fair = config("fair")
    assert plan(snapshot(fair, short, ahead), fair).leave == ()
    apart = config(gpus=((0,), (1,)))
    assert plan(snapshot(apart, short, ahead), apart).leave == ()
    # c's held stream due 2 s hence: awake 1.7 s hence (its wake 0.3 s), not at once beside a; looked at again a
    # token's time hence (a may have its slack by then)
    s = snapshot(deadline, short, (now - 3.0, now - 2.0, 31), c_due=2.0)
    assert not_due_s(s["c"], s, short_of_slack(s, deadline), deadline) == pytest.approx(1.7)
    p = plan(s, deadline)
    assert p.leave == () and p.then == Wait(pytest.approx(0.1)), p
    assert plan(snapshot(deadline, ahead, ahead, c_due=2.0), deadline).then == Wake("c")  # none short beside it
    assert plan(snapshot(deadline, short, ahead, c_due=0), deadline).then == Wake("c")  # a first token: at once
    assert plan(snapshot(fair, short, ahead, c_due=2.0), fair).then == Wake("c")


def test_an_engine_ahead_parks_holding_its_stream_and_wakes_once_the_one_beside_it_has_its_slack(caplog):
    """The rule above acted on (``Switcher._act``, ``Lifecycle.leave``), over fake engines whose parks keep their KV
    caches: a's stream is far ahead of its deadlines and b's, beside it, short of slack; a leaves for b's streams
    (logged so), parks holding its stream, and does not come after b (``left_for`` stays empty). Its stream waits
    again, due by its next token. Once b's stream has its slack (no event says so: the deadline schedule looks again
    a token's time hence), a wakes and its stream goes on."""
    from hotweights.switch.preempt import COMPLETIONS, Resumable
    from hotweights.switch.turns import token_due

    async def main():
        s, engines, log = make(["a", "b"], max_awake="auto", schedule="deadline", preempt=True)
        for e in engines.values():
            e.keeps_kv = True
        task = await started(s)
        a, b = s.models["a"], s.models["b"]
        await s.acquire("b")
        await s.acquire("a")
        now = time.monotonic()
        ahead = Resumable(COMPLETIONS, {}, ids=[0] * 100, arrived=now - 3.0, first_at=now - 2.5)  # 7.4 s of slack
        behind = Resumable(COMPLETIONS, {}, ids=[0], arrived=now - 0.1, first_at=now)  # its next token due now
        woke: list[float] = []

        async def relay() -> None:  # a's stream as the port relays it: paused, its place given back, waited for again
            await ahead.pause.wait()
            a.streams.discard(ahead)
            s.release(a)
            await s.acquire("a", token_due(ahead.arrived, ahead.first_at, len(ahead.ids), s.config))
            woke.append(time.monotonic())

        relaying = asyncio.create_task(relay())
        a.streams.add(ahead)
        b.streams.add(behind)
        s.life.changes.changed()
        for _ in range(200):
            if "park a keeping its KV cache" in log:
                break
            await asyncio.sleep(0.005)
        assert "park a keeping its KV cache" in log and a.left_for == "" and not woke, log
        behind.ids += [0] * 100  # b's stream has its slack now
        await asyncio.wait_for(relaying, 2.0)
        assert log.index("wake a") > log.index("park a keeping its KV cache") and a.state is ModelState.AWAKE
        s.release(a)
        s.release(b)
        task.cancel()

    with caplog.at_level("INFO", logger="hotweights.switch"):
        asyncio.run(main())
    assert "a leaves for b: 0 request(s) in flight end first (1 held with their KV caches, going on at its next " \
           "wake), its streams ahead of their deadlines and b's not: the GPU's time to b" in caplog.text, caplog.text


@pytest.mark.parametrize("schedule", ["fair", "deadline"])
def test_a_model_whose_engine_left_for_another_comes_after_it_while_that_one_waits(schedule):
    """Issue 69, from an H100 run of five 8B: m4 left for m3, its held streams waited for m4 again, and m4 woke
    again before m3, twice (each 0.35 s), m3 still waiting. A leaving engine's paused streams are more than the other
    model's requests (fair) and due sooner (deadline); the model it left for goes first all the same, until it is
    awake."""
    from hotweights.switch.schedule import wanted
    from hotweights.switch.snapshot import Snapshot, View

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "abc"), max_awake="auto", schedule=schedule,
                          slo_ttft_s=2.0, slo_token_s=0.1)
    need, now = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950), 1000.0
    paused = View(config.models[0], ModelState.PARKED, need, waiting=3, arrivals=(now - 0.05,) * 3,
                  dues=(now + 0.2,) * 3, left_for="b")  # three held streams, their next tokens due in 0.2 s
    b = View(config.models[1], ModelState.PARKED, need, waiting=1, arrivals=(now - 0.3,), dues=(None,))
    c = View(config.models[2], ModelState.AWAKE, need, inflight=1)

    def order(*views: View) -> list[str]:
        return [v.name for v in wanted(Snapshot(views, {0: 80 * GIB}, now, "a"), config)]

    assert order(paused, b, c) == ["b", "a"]
    assert order(dataclasses.replace(paused, left_for=""), b, c) == ["a", "b"]  # what the schedule says alone
    assert order(paused, dataclasses.replace(b, state=ModelState.AWAKE), c) == ["a"]  # b awake: a's turn again


def test_a_model_that_does_not_fit_even_alone_tries_its_wake_only_first_once_nothing_leaves_and_within_the_cap():
    """Issue 69 on an H100 (five 8B, ``max_awake = 1``): a host-tier model the estimate says cannot fit even alone
    (held KV caches beside it) woke as the model after the first in the order, beside an engine still leaving, and
    its wakes were refused for memory. Its own wake still says whether it fits, but only as the model served next,
    with the idle engines parked, once the leaving ones have parked, and within ``max_awake``."""
    from hotweights.switch.schedule import Wait, Wake, plan, room_for
    from hotweights.switch.snapshot import Snapshot, View

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "abc"), max_awake=1, turn_s=1.0)
    need, now = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950), 1000.0
    huge = GpuNeed((0,), 0.0, 150 * GIB, 20 * GIB, parked_mib=1950)  # over the GPU's 112 GiB by the estimate

    def snap(a_state="leaving", a_inflight=0, b_waiting=2):
        return Snapshot((View(config.models[0], ModelState(a_state), need, inflight=a_inflight, last_used=1.0),
                         View(config.models[1], ModelState.PARKED, need, waiting=b_waiting,
                              arrivals=(now - 0.1,) * b_waiting),
                         View(config.models[2], ModelState.PARKED, huge, waiting=1, arrivals=(now - 0.1,))),
                        {0: 112 * GIB}, now, "a")

    assert isinstance(plan(snap(), config).then, Wait)  # b waits for a to park; c does not wake beside a
    r = room_for(snap()["c"], snap(), config)
    assert r.trial and r.wait and not r.now, r
    s = snap(b_waiting=0)  # c first: it still waits for a to park
    assert isinstance(plan(s, config).then, Wait)
    s = snap("awake", a_inflight=1, b_waiting=0)  # a busy, its turn not over: max_awake holds c back
    assert isinstance(plan(s, config).then, Wait) and room_for(s["c"], s, config).look_in_s is not None
    s = snap("awake", b_waiting=0)  # a idle: it parks, and c tries
    assert plan(s, config).then == Wake("c", room_for(s["c"], s, config)) and room_for(s["c"], s, config).park == ("a",)


def test_a_busy_engine_leaves_holding_its_streams_where_what_it_keeps_fits_else_they_continue_from_tokens():
    """Issue 69, part 1, as a table over views: a busy engine whose turn is over leaves holding its streams with their
    KV caches (``Room.keep``, ``Leave.keep``) where the wake fits beside all it then keeps parked (its own memory,
    its weights gone to host memory); where only a park that lets the KV cache go makes room, its streams are
    continued from their tokens; and a parked engine that holds them counts its KV cache."""
    from hotweights.switch.memory import Holder, held_mib
    from hotweights.switch.schedule import Leave, plan, room_for
    from hotweights.switch.snapshot import Snapshot, View

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n, parked_weights="host") for n in "abcd"),
                          max_awake="auto", turn_s=1.0)
    need = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950)  # awake 37 GiB with its weights, parked 1.9
    now = 1000.0

    def snap(total_gib, can_hold=True):
        views = (View(config.models[0], ModelState.AWAKE, need, inflight=1, last_used=1.0, can_hold=can_hold),
                 View(config.models[1], ModelState.AWAKE, need, inflight=1, last_used=2.0),
                 View(config.models[2], ModelState.PARKED, need, waiting=1, arrivals=(now - 20,)),  # starving
                 View(config.models[3], ModelState.PARKED, need))
        return Snapshot(views, {0: total_gib * GIB}, now, "a")

    s = snap(112)
    r = room_for(s["c"], s, config)
    assert r.leave == ("a",) and r.keep == ("a",), r  # a held keeps 22 GiB: c fits beside it
    assert plan(s, config).leave == (Leave("a", "c", 1, True),)
    s = snap(97)
    r = room_for(s["c"], s, config)
    assert r.leave == ("a",) and r.keep == (), r  # held, c would not fit: a's KV cache goes, its streams continue
    assert plan(s, config).leave == (Leave("a", "c", 1, False),)
    s = snap(112, can_hold=False)
    assert room_for(s["c"], s, config).keep == ()  # nothing it could hold (no stream, or its park keeps none)
    parked, held = Holder(need, ModelState.PARKED, False), Holder(need, ModelState.PARKED, False, True)
    assert held_mib(parked, 112 * GIB) == 1950 and held_mib(held, 112 * GIB) == 20 * GIB + 1950
    # a pinned KV cache (vLLM's --kv-cache-memory-bytes): held, its activations given back (vLLM's held park empties
    # torch's cache), awake, counted
    pinned = GpuNeed((0,), 0.3, 15 * GIB, parked_mib=976, engine_kv_mib=2048, activations_mib=3616)
    assert held_mib(Holder(pinned, ModelState.PARKED, True, True), 80 * GIB) == 15 * GIB + 2048 + 976
    assert held_mib(Holder(pinned, ModelState.AWAKE, True), 80 * GIB) == 15 * GIB + 2048 + 976 + 3616


def test_a_gpu_tier_engine_that_would_free_nothing_held_does_not_leave_for_a_host_tier_wake():
    """Issue 69 on an H100 (five 8B, the deadline schedule): for one host-tier wake, two GPU-tier engines left holding
    their streams beside the host-tier one whose leaving made the room; held, a GPU-tier engine keeps its weights and
    its KV cache, so it frees nothing. The one that frees the room leaves alone."""
    from hotweights.switch.schedule import room_for
    from hotweights.switch.snapshot import Snapshot, View

    tiers = {"a": "gpu", "b": "gpu", "c": "host", "d": "host"}
    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n, parked_weights=t) for n, t in tiers.items()),
                          max_awake="auto", turn_s=1.0)
    need = GpuNeed((0,), 0.0, 15 * GIB, 2 * GIB, parked_mib=1950)  # awake 19 GiB with its weights
    now = 1000.0
    views = (View(config.models[0], ModelState.AWAKE, need, inflight=1, last_used=1.0, can_hold=True),
             View(config.models[1], ModelState.AWAKE, need, inflight=1, last_used=2.0, can_hold=True),
             View(config.models[2], ModelState.AWAKE, need, inflight=1, last_used=3.0, can_hold=True),
             View(config.models[3], ModelState.DEEP, need, waiting=1, arrivals=(now - 20,)))  # starving
    s = Snapshot(views, {0: 72 * GIB}, now, "a")  # a, b: 17 GiB parked or 19 awake; c, d 19 awake or 2 parked
    r = room_for(s["d"], s, config)
    assert r.leave == ("c",) and r.keep == ("c",), r  # before: ("a", "b", "c"), all three held


def test_a_park_that_moves_its_kv_cache_to_host_memory_holds_its_streams_where_one_on_the_gpu_could_not():
    """Issue 69, part 1b (``held_kv = "host"``, vLLM's): an engine that holds its streams with their KV cache in
    pinned host memory keeps on the GPU only what a park without them keeps, so the memory model counts it so: a
    wake that would not fit beside a held KV cache on the GPU fits beside one in host memory (the streams held, not
    continued from their tokens), and a parked engine holding them takes no more than a plain park."""
    from hotweights.switch.memory import held_mib
    from hotweights.switch.schedule import room_for
    from hotweights.switch.snapshot import Snapshot, View

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n, parked_weights="host") for n in "abc"),
                          max_awake="auto", turn_s=1.0)
    need = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950)  # awake 37 GiB with its weights, parked 1.9
    now = 1000.0
    for kv_host, keep in ((False, ()), (True, ("a",))):
        views = (View(config.models[0], ModelState.AWAKE, need, inflight=1, last_used=1.0, can_hold=True,
                      kv_host=kv_host),
                 View(config.models[1], ModelState.AWAKE, need, inflight=1, last_used=2.0),
                 View(config.models[2], ModelState.PARKED, need, waiting=1, arrivals=(now - 20,)))  # starving
        s = Snapshot(views, {0: 95 * GIB}, now, "a")
        r = room_for(s["c"], s, config)
        assert r.leave == ("a",) and r.keep == keep, (kv_host, r)  # on the GPU its 22 GiB leave c no room
    held = View(config.models[0], ModelState.PARKED, need, kv_held=True, kv_host=True)
    assert held_mib(held.holder(), 112 * GIB) == 1950 == held_mib(dataclasses.replace(held, kv_held=False).holder(),
                                                                     112 * GIB)
    from hotweights.switch.upstream.engines import Engine
    from hotweights.switch.upstream.parking import park_asks

    vllm, embedded = ModelConfig("v", Path("/m/v"), engine="vllm"), ModelConfig("e", Path("/m/e"))
    engines = [Engine(vllm, Path("/tmp"), held_kv="host"), Engine(vllm, Path("/tmp"))]
    for e in engines:
        e.parks = True  # as on a GPU (vLLM's CPU build cannot park)
    assert [e.kv_to_host for e in engines] == [True, False]  # vLLM's held park moves it where asked
    assert not Engine(embedded, Path("/tmp"), held_kv="host").kv_to_host  # the embedded engine's does not
    assert park_asks("vllm", 2, True, kv_to_host=True) == [
        ("/pause?mode=keep", None), ("/collective_rpc", {"method": "hotweights_hold", "args": ["2", "host"]})]
    # its first plain park makes the pinned host buffers ahead (the H100's first held park that made them took 1.40 s)
    assert park_asks("vllm", 1, False, kv_to_host=True, pin_host=True) == [
        ("/sleep?level=1", None), ("/collective_rpc", {"method": "hotweights_pin_host"})]
    assert park_asks("vllm", 1, False, kv_to_host=True) == park_asks("hotweights", 1, False, pin_host=True) == [
        ("/sleep?level=1", None)]  # the next ones ask nothing more


def test_the_plan_is_a_function_of_a_snapshot_as_a_table():
    """Review f, move 1: ``schedule.plan`` says what the scheduler does next from a snapshot alone: start a model
    requests wait for that start-up has not reached, wake one that fits, make busy engines whose turn is over leave
    (and wake another beside them only where it fits with nothing moved), start-up's next start, or wait."""
    from hotweights.switch.schedule import Leave, Room, Start, Wait, Wake, plan
    from hotweights.switch.snapshot import Snapshot, View

    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "abcd"), max_awake="auto", turn_s=1.0)
    need = GpuNeed((0,), 0.0, 15 * GIB, 20 * GIB, parked_mib=1950)  # room for two awake of 112 GiB
    small = GpuNeed((0,), 0.0, 1 * GIB, 1 * GIB)
    now = 1000.0

    def snap(**given):
        """Each model (a-d) parked, started, idle, unless ``given`` says (state, inflight, waited, started, need)."""
        views = []
        for i, c in enumerate(config.models):
            state, inflight, waited, started, n = given.get(c.name, ("parked", 0, (), True, need))
            views.append(View(c, ModelState(state), n, StartState.UP if started else StartState.WAITING,
                              inflight=inflight, last_used=float(i),
                              waiting=len(waited), arrivals=tuple(now - w for w in waited)))
        return Snapshot(tuple(views), {0: 112 * GIB}, now, "a")

    awake, busy = ("awake", 0, (), True, need), ("awake", 1, (), True, need)
    assert plan(snap(), config).then == Wait()  # nothing waits, start-up is done
    assert plan(snap(c=("starting", 0, (), False, need)), config).then == Start(("c",))  # start-up's next
    assert plan(snap(c=("starting", 0, (0.1,), False, need)), config).then == Start(("c",))  # a request waits
    assert plan(snap(a=awake, c=("parked", 0, (0.1,), True, need)), config).then == Wake("c")  # fits beside a
    p = plan(snap(a=awake, b=awake, c=("parked", 0, (0.1,), True, need)), config)
    assert p.then == Wake("c", Room(park=("a",))) and not p.leave  # a, idle and used first, parks
    p = plan(snap(a=busy, b=busy, c=("parked", 0, (0.1,), True, need)), config)
    assert p.then == Wait(look_in_s=p.then.look_in_s) and 0.89 < p.then.look_in_s < 0.91 and not p.leave
    p = plan(snap(a=busy, b=busy, c=("parked", 0, (5.0,), True, need), d=("parked", 0, (0.1,), True, small)),
             config)  # c waited its turn: a leaves for it; d fits beside the leaving a and b with nothing moved
    assert p.leave == (Leave("a", "c", 1),) and p.then == Wake("d"), p
    p = plan(snap(a=busy, b=busy, c=("parked", 0, (5.0,), True, need), d=("parked", 0, (0.1,), True, need)),
             config)  # d does not fit until c has woken: it waits too
    assert p.leave == (Leave("a", "c", 1),) and p.then == Wait(), p
    # issue 68: a crashed default (or kept-awake) engine starts again with no request, once its back-off is over
    died = Failure(FailureKind.DIED, "its engine exited (code -9)", retry_at=now)
    crashed = ("failed", 0, (), True, need)

    def with_failure(snapshot, name, failure):
        views = tuple(dataclasses.replace(v, failure=failure) if v.name == name else v for v in snapshot.models)
        return dataclasses.replace(snapshot, models=views)

    assert plan(with_failure(snap(a=crashed), "a", died), config).then == Wake("a")  # the default
    assert plan(with_failure(snap(b=crashed), "b", died), config).then == Wait()  # its next request starts it
    later = dataclasses.replace(died, retry_at=now + 30)
    waits = plan(with_failure(snap(a=crashed), "a", later), config).then  # a crash loop's back-off: looked at again
    assert isinstance(waits, Wait) and abs(waits.look_in_s - 30.01) < 1e-6, waits  # at its end, not by a timer only


def test_the_lifecycle_alone_starts_parks_wakes_and_stops_engines_without_requests():
    """Review e, move 6: the lifecycle is an object of its own, driven here as the scheduler would drive it, with no
    request side: each move goes through the state table and says so to whoever waits for a change."""
    from hotweights.switch.lifecycle import Lifecycle

    async def main():
        log: list[str] = []
        config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n) for n in "ab"), max_awake=1)
        life = Lifecycle(config, SwitchMetrics(), lambda m: FakeEngine(m, log))
        a, b = life.models["a"], life.models["b"]
        startup = life.begin_startup()  # its jobs: each start's preload
        changed = asyncio.create_task(life.changes.next(5.0))
        async with life.busy:
            await life.start_up(a)  # the default: it stays awake
            await life.start_up(b)  # not the default, no request waits: it parks right after its start
        assert changed.done() and (a.state, b.state) == (ModelState.AWAKE, ModelState.PARKED)
        room = life.room(b)  # max_awake 1: a (idle) parks for b
        assert room.park == ("a",) and not room.wait
        async with life.busy:
            await life.switch_to(b, room)
        assert (a.state, b.state) == (ModelState.PARKED, ModelState.AWAKE) and b.wakes == 1
        assert log == ["start a", "start b", "park b", "park a", "wake b"]
        assert [s.model for s in life.switched] == ["b"] and life.switched[0].parked == ("a",)
        with pytest.raises(InvalidTransition, match="a: parked -> leaving"):
            life.move(a, ModelState.LEAVING)
        await life.stop_all()
        startup.cancel()
        assert {m.state for m in life.models.values()} == {ModelState.STOPPED}
    asyncio.run(main())


def test_an_operator_parks_stops_and_starts_one_model():
    """Issue 53: park (a busy engine leaves and parks once its requests end), stop (its engine gone), start (awake
    again, staying awake); a request for a stopped model starts it again."""
    from hotweights.switch.actions import act

    async def main():
        s, engines, log = make(["a", "b"], max_awake="auto")
        task = await started(s)
        a, b = s.models["a"], s.models["b"]
        assert await act(s.life, b, "start") == "awake" and states(s) == {"a": "awake", "b": "awake"}
        busy = asyncio.create_task(request(s, "a", hold_s=0.2))
        await asyncio.sleep(0.01)
        assert (await act(s.life, a, "park")).startswith("leaving: it parks once its 1 request(s)")
        await busy
        while states(s)["a"] != "parked":
            await asyncio.sleep(0.005)
        assert await act(s.life, b, "stop") == "stopped" and not engines["b"].running and states(s)["b"] == "stopped"
        assert await act(s.life, b, "stop") == "stopped already"
        log.clear()
        assert await request(s, "b") == "b" and log == ["start b"]  # a request starts it again
        assert await act(s.life, a, "start") == "awake" and states(s) == {"a": "awake", "b": "awake"}
        task.cancel()
    asyncio.run(main())


def test_idle_timeouts_park_then_stop_a_model():
    async def main():
        models = (ModelConfig("a", Path("/m/a")), ModelConfig("b", Path("/m/b"), park_after_s=0.1, stop_after_s=0.4))
        engines: dict[str, FakeEngine] = {}

        def factory(m: ModelConfig) -> FakeEngine:
            engines[m.name] = FakeEngine(m, [])
            return engines[m.name]

        s = Switcher(SwitchConfig(models), SwitchMetrics(), factory)
        task = await started(s)
        watching = asyncio.create_task(s.watch(0.02))
        await request(s, "b")
        assert states(s)["b"] == "awake"
        await asyncio.sleep(0.3)
        assert states(s) == {"a": "awake", "b": "parked"}  # b idle 0.1 s: parked; a has no timeout
        await asyncio.sleep(0.4)
        assert states(s) == {"a": "awake", "b": "stopped"} and not engines["b"].running
        assert await request(s, "b") == "b" and states(s)["b"] == "awake"  # started again by a request
        watching.cancel()
        task.cancel()
    asyncio.run(main())


def test_cached_and_lazy_models_start_for_their_first_request():
    """Issue 53: every engine started at start-up (16 minutes for ten 8B from an empty keeper). A cached model is
    preloaded then and started by its first request; a lazy one has nothing done until its first request."""
    async def main():
        preloaded: list[str] = []

        class Counted(FakeEngine):
            def preload(self) -> PreloadOutcome:
                preloaded.append(self.name)
                return PreloadOutcome("cached")

        models = (ModelConfig("a", Path("/m/a")), ModelConfig("b", Path("/m/b"), start="cached"),
                  ModelConfig("c", Path("/m/c"), start="lazy"))
        log: list[str] = []
        s = Switcher(SwitchConfig(models, max_awake="auto", preload_jobs=2), SwitchMetrics(), lambda m: Counted(m, log))
        task = asyncio.create_task(s.run())
        await asyncio.wait_for(s.life.ready.wait(), 5)
        while len(preloaded) < 2 or s.life.busy.locked():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert sorted(preloaded) == ["a", "b"] and log == ["start a"], (preloaded, log)
        assert states(s) == {"a": "awake", "b": "stopped", "c": "stopped"}
        assert await request(s, "b") == "b" and log == ["start a", "start b"] and sorted(preloaded) == ["a", "b"]
        assert await request(s, "c") == "c" and log[-1] == "start c" and sorted(preloaded) == ["a", "b", "c"]
        assert states(s) == {"a": "awake", "b": "awake", "c": "awake"}
        task.cancel()
    asyncio.run(main())


def test_the_ledger_keeps_a_batch_place_for_each_request_let_in_and_only_for_those():
    """A switch lets in the requests waiting (counted in flight at once); one of them that gives up gives its place
    back; one that came after the switch has no place to give back (before: any request that gave up while places
    were kept took one away, and an in-flight count with it)."""
    from hotweights.switch.model import Ledger

    async def main():
        ledger = Ledger()
        assert ledger.idle.is_set() and not ledger.inflight
        a, b = ledger.arrive(), ledger.arrive()
        assert ledger.let_in() == 2 and (ledger.reserved, ledger.inflight) == (2, 2) and not ledger.idle.is_set()
        late = ledger.arrive()  # after the switch: it waits for a place of its own
        assert not ledger.gone(late, served=False)  # it gave up: no place was kept for it
        assert (ledger.waiting, ledger.reserved, ledger.inflight) == (2, 2, 2)
        assert ledger.enter(awake=False) and not ledger.gone(a, served=True)  # a takes its place
        assert not ledger.gone(b, served=False)  # b gave up: its place goes back, one in flight (a) is left
        assert (ledger.waiting, ledger.reserved, ledger.inflight) == (0, 0, 1)
        c = ledger.arrive()
        assert not ledger.enter(awake=False)  # no place kept, the engine not awake: it waits on
        assert ledger.enter(awake=True) and not ledger.gone(c, served=True)
        assert not ledger.leave() and ledger.leave() and ledger.idle.is_set()  # the second end leaves it idle
        # review f, move 3: a failed switch reaches the requests that waited for it as a value, its reason
        d, e = ledger.arrive(), ledger.arrive()
        assert ledger.refuse("would not wake: out of memory") == 2
        f = ledger.arrive()  # after the failure: it waits for the next switch
        assert ledger.refusal(d) == "would not wake: out of memory" and not ledger.refusal(f)
        assert not ledger.gone(d, served=False) and not ledger.gone(e, served=False) and not ledger.refused
        assert not ledger.gone(f, served=False) and (ledger.waiting, ledger.reserved, ledger.inflight) == (0, 0, 0)
    asyncio.run(main())


def test_a_reload_is_what_a_new_config_adds_removes_and_changes_and_refuses_what_cannot_change_live():
    from hotweights.switch.config import ConfigError
    from hotweights.switch.running import diff

    a, b, c = (ModelConfig(n, Path("/m") / n) for n in "abc")
    old = SwitchConfig((a, b), preload_jobs=4)
    new, change = diff(old, SwitchConfig((a, dataclasses.replace(b, args=("--max-model-len", "32")), c)))
    assert (change.added, change.removed, change.changed) == (("c",), (), ("b",)) and new.preload_jobs == 4
    assert diff(old, SwitchConfig((a,)))[1].line() == "removed b"
    assert diff(old, old)[1].line() == "no model changed"
    with pytest.raises(ConfigError, match="port cannot change while the front runs"):
        diff(old, SwitchConfig((a, b), port=9000))


@pytest.mark.parametrize("value, seconds", [(300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5),
                                            ("-1", float("inf")), (-1, float("inf")), ("0", 0.0), ("2.5", 2.5)])
def test_keep_alive_is_seconds_or_a_go_duration_and_negative_is_for_ever(value, seconds):
    import json

    from hotweights.switch.port.validate import Refused, keep_alive_of

    assert keep_alive_of(json.dumps({"keep_alive": value}).encode()) == seconds
    assert keep_alive_of(b'{"model": "a"}') is None
    with pytest.raises(Refused, match="keep_alive must be seconds or a duration"):
        keep_alive_of(b'{"keep_alive": "soon"}')
