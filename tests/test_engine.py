"""The embedded server's engine thread (``serve/engine.py``): cancelled jobs free it, ``health`` tells the
truth. A stand-in decoder whose steps the test controls (a real one is driven in test_serve_faults.py).

Run: pytest tests/test_engine.py
"""

from __future__ import annotations

import asyncio
import threading

from hotweights.serve.engine import Engine
from hotweights.serve.generate import Chunk, SamplingParams


class Decoder:
    """``stream`` as the real Generator's: asks ``should_stop`` before each step; a step waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.steps = 0

    def stream(self, prompt_ids, params, *, should_stop):
        for i in range(params.max_tokens):
            if should_stop():
                return
            self.gate.wait()
            self.steps += 1
            yield Chunk("x", "length" if i == params.max_tokens - 1 else None, i + 1)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_cancelled_job_frees_the_engine_for_the_next():
    decoder = Decoder()
    engine = Engine(decoder)

    async def scenario():
        endless = engine.submit([1], SamplingParams(max_tokens=10**9))
        async for chunk in endless.chunks():
            if chunk.num_tokens >= 3:
                break
        endless.cancel()
        short = engine.submit([1], SamplingParams(max_tokens=2))
        return [c async for c in short.chunks()]

    chunks = run(scenario())
    assert [c.finish_reason for c in chunks] == [None, "length"]
    assert decoder.steps < 10**6  # the endless job stopped at a step boundary
    assert engine.health() is None


def test_health_names_a_stalled_step_and_a_shutdown():
    decoder = Decoder()
    engine = Engine(decoder, stall_s=0.2)

    async def scenario():
        decoder.gate.clear()  # the next step hangs
        job = engine.submit([1], SamplingParams(max_tokens=5))
        await asyncio.sleep(0.5)
        stalled = engine.health()
        decoder.gate.set()
        done = [c async for c in job.chunks()]
        return stalled, done

    stalled, done = run(scenario())
    assert stalled is not None and "no decoding step for" in stalled
    assert done[-1].finish_reason == "length" and engine.health() is None
    engine.stop()
    assert engine.health() == "the server is shutting down"


def test_jobs_end_unanswered_when_the_engine_stops():
    decoder = Decoder()
    engine = Engine(decoder)

    async def scenario():
        running = engine.submit([1], SamplingParams(max_tokens=10**9))
        async for _ in running.chunks():
            break
        engine.stop()
        late = engine.submit([1], SamplingParams(max_tokens=3))  # refused: ends at once
        return [c async for c in running.chunks()][-1:], [c async for c in late.chunks()]

    tail, late = run(scenario())
    assert (not tail or tail[-1].finish_reason is None) and late == []
