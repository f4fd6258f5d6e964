"""The switch's scheduling, with fake engines (no processes, milliseconds each): start-up order, the batch a switch
serves, which engine parks, ``max_awake`` per GPU, a wake refused for memory, a failed start's back-off, the fair and
fifo schedules, the state table. The real engines behind it: tests/test_switch.py and tests/test_switch_faults.py.

Run: pytest tests/test_switcher.py
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from hotweights.switch.config import ModelConfig, SwitchConfig
from hotweights.switch.engines import EngineError, WakeRefused
from hotweights.switch.metrics import SwitchMetrics
from hotweights.switch.states import InvalidTransition, ModelState
from hotweights.switch.switcher import Switcher, Unavailable


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

    @property
    def pid(self) -> int:
        return 1 if self.running else 0

    def pids(self) -> list[int]:
        return [1] if self.running else []

    def alive(self) -> bool:
        return self.running

    def preload(self) -> str:
        return "cached"

    def start(self) -> float:
        time.sleep(self.delay_s)
        self.log.append(f"start {self.name}")
        if self.fail_start:
            raise EngineError(f"{self.name}: its engine exited with code 1 while starting: {self.fail_start}")
        self.running = True
        return self.delay_s

    def park(self, level: int) -> None:
        time.sleep(self.delay_s)
        self.log.append(f"park {self.name}")

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

    def die(self) -> None:
        self.running, self.exit_code = False, -9


def make(names: list[str], **switch) -> tuple[Switcher, dict[str, FakeEngine], list[str]]:
    log: list[str] = []
    gpus = switch.pop("gpus", {})
    host = switch.pop("host", ())
    models = tuple(ModelConfig(n, Path("/m") / n, gpus=tuple(gpus.get(n, ())), parked_weights="host" if n in host
                               else "gpu") for n in names)
    engines: dict[str, FakeEngine] = {}

    def factory(m: ModelConfig) -> FakeEngine:
        engines[m.name] = FakeEngine(m, log)
        return engines[m.name]

    return Switcher(SwitchConfig(models, **switch), SwitchMetrics(), factory), engines, log


async def started(s: Switcher) -> asyncio.Task:
    task = asyncio.create_task(s.run())
    while not all(m.started for m in s.models.values()) or s.busy.locked():
        await asyncio.sleep(0.001)
    return task


async def request(s: Switcher, name: str, hold_s: float = 0.0) -> str:
    m = await s.acquire(name)
    assert m.state is ModelState.AWAKE
    await asyncio.sleep(hold_s)
    s.release(m)
    return name


def states(s: Switcher) -> dict[str, str]:
    return {n: m.state.value for n, m in s.models.items()}


def test_start_up_leaves_the_default_awake_and_parks_the_others():
    async def main():
        s, _, log = make(["a", "b", "c"])
        task = await started(s)
        assert states(s) == {"a": "awake", "b": "parked", "c": "parked"} and s.ready.is_set()
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


def test_fifo_parks_the_least_recently_used_even_when_it_is_busy():
    async def main():
        s, _, log = make(["a", "b", "c"], max_awake=2, schedule="fifo")
        task = await started(s)
        await request(s, "b")
        busy = asyncio.create_task(request(s, "a", hold_s=0.2))
        await asyncio.sleep(0.01)
        await request(s, "b")  # b used after a began
        log.clear()
        began = time.monotonic()
        await request(s, "c")
        assert log == ["park a", "wake c"] and time.monotonic() - began >= 0.15  # waited for a's request
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
    from hotweights.switch import operations

    monkeypatch.setattr(operations, "BACKOFF_S", 0.2)

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
            m.failure = type(m.failure)("start", m.failure.message, 0.0, m.failure.files)  # its back-off is over
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
        assert await s.engine_died(s.models["a"]) and states(s)["a"] == "failed"
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
        assert log[:3] == ["start a", "start c", "park a"], log  # before b, and awake for it: not parked first
        while not s.models["b"].started or s.busy.locked():
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
            s.move(s.models["a"], ModelState.STARTING)
        s.move(s.models["a"], ModelState.STOPPED)
        with pytest.raises(InvalidTransition, match="stopped -> awake"):
            s.move(s.models["a"], ModelState.AWAKE)
    asyncio.run(main())


def test_the_default_serves_while_its_host_copy_is_made_ahead():
    """``parked_weights = "host"``: the default's host copy (seconds for an 8B) is made after it is ready."""
    async def main():
        s, engines, _ = make(["a", "b"], host=("a",))
        engines["a"].copy_s = 0.3
        task = asyncio.create_task(s.run())
        began = time.monotonic()
        await asyncio.wait_for(s.ready.wait(), 5)
        assert time.monotonic() - began < 0.2 and s.busy.locked()  # ready, the copy still going
        task.cancel()
    asyncio.run(main())


def test_a_switch_behind_a_long_request_wakes_its_model_beside_it_and_the_busy_engine_parks_when_it_ends():
    async def main():
        s, _, log = make(["a", "b"], overlap_after_s=0.1)
        task = await started(s)
        busy = asyncio.create_task(request(s, "a", hold_s=0.6))  # a long generation on the awake engine
        await asyncio.sleep(0.01)
        log.clear()
        began = time.monotonic()
        await request(s, "b")
        waited = time.monotonic() - began
        assert 0.09 < waited < 0.4, waited  # the overlap, not the 0.6 s generation
        assert log == ["wake b"] and states(s) == {"a": "awake", "b": "awake"} and not busy.done()
        assert s.models["a"].draining  # a takes no new request meanwhile
        await busy
        while states(s)["a"] != "parked":
            await asyncio.sleep(0.005)
        assert log == ["wake b", "park a"] and not s.models["a"].draining
        task.cancel()
    asyncio.run(main())


def test_with_overlap_off_or_no_room_a_switch_waits_for_the_busy_engine():
    async def main(overlap: float, refuse: int) -> tuple[float, list[str]]:
        s, engines, log = make(["a", "b"], overlap_after_s=overlap)
        task = await started(s)
        engines["b"].refuse_wakes = refuse  # the GPU has no room for b beside a
        busy = asyncio.create_task(request(s, "a", hold_s=0.4))
        await asyncio.sleep(0.01)
        log.clear()
        began = time.monotonic()
        await request(s, "b")
        waited = time.monotonic() - began
        assert busy.done() and states(s) == {"a": "parked", "b": "awake"}
        task.cancel()
        return waited, log

    waited, log = asyncio.run(main(0.0, 0))
    assert waited > 0.35 and log == ["park a", "wake b"], (waited, log)
    waited, log = asyncio.run(main(0.1, 1))  # woke beside, refused for memory: it waits for a after all
    assert waited > 0.35 and log == ["park a", "wake b"], (waited, log)


def test_a_model_switched_to_while_it_was_to_park_stays_awake():
    async def main():
        s, _, log = make(["a", "b"], overlap_after_s=0.1)
        task = await started(s)
        busy_a = asyncio.create_task(request(s, "a", hold_s=0.8))
        await asyncio.sleep(0.01)
        log.clear()
        busy_b = asyncio.create_task(request(s, "b", hold_s=0.8))  # b wakes beside a after 0.1 s, and stays busy
        while states(s)["b"] != "awake":
            await asyncio.sleep(0.005)
        began = time.monotonic()
        await request(s, "a")  # a was to park: after b's 0.1 s overlap it stays, and b is to park instead
        assert time.monotonic() - began < 0.5 and "park a" not in log, log
        await asyncio.gather(busy_a, busy_b)
        while states(s)["b"] != "parked":
            await asyncio.sleep(0.005)
        assert states(s) == {"a": "awake", "b": "parked"} and log == ["wake b", "park b"], log
        task.cancel()
    asyncio.run(main())
