"""The front's bookkeeping of the answers it relays: each request's line in the log (``Said``), the stop of every
open stream when the front is asked to stop (``Stopping``), and the relay of a stream that may be paused and
continued (``relay_resumable``, ``preempt.py``): held on its connection where the plan has its engine park keeping
its KV cache (``upstream/parking.py``), else continued from its token ids by a new request. Torch-free."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from ...openai_errors import stream_error
from ..door import SwitchPort, Unavailable
from ..model import Model
from ..preempt import COMPLETIONS, Events, Resumable
from ..turns import token_due

logger = logging.getLogger("hotweights.switch")


class Said:
    """One relayed request, for its line in the front's log: ``switch: request a /v1/completions 200, waited 0.012 s,
    first byte 0.054 s, 1.532 s in all, 37 tokens`` (the tokens where the engine's answer ends with its usage; a
    stream that may pause adds ``, joined 0.004 s after its place``: from its place in flight until it was among its
    model's streams, the window in which a leave does not pause it)."""

    TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')

    def __init__(self, name: str, path: str, code: int, arrived: float, waited: float) -> None:
        self.name, self.path, self.code, self.arrived, self.waited = name, path, code, arrived, waited
        self.first = 0.0
        self.end = b""  # the answer's last bytes: its usage, where it has one
        self.paused = 0  # times its stream was paused and continued (preempt.py)
        self.outcome = "ok"  # or: abandoned (its client left), cut (the front stopped), broken (its engine's broke off)
        self.joined = 0.0  # time.monotonic() a stream that may pause joined its model's streams (0: none)

    def seen(self, chunk: bytes) -> None:
        if not self.first:
            self.first = time.monotonic()
        self.end = (self.end + chunk)[-4096:]

    def line(self) -> str:
        tokens = self.TOKENS.findall(self.end)
        how = {"abandoned": " (its client left)", "cut": " (cut: the front stopped)",
               "broken": " (its engine's answer broke off)"}.get(self.outcome, "")
        return (f"switch: request {self.name} {self.path} {self.code}{how}, waited {self.waited:.3f} s"
                + (f", first byte {self.first - self.arrived:.3f} s" if self.first else "")
                + f", {time.monotonic() - self.arrived:.3f} s in all"
                + (f", {int(tokens[-1])} tokens" if tokens else "")
                + (f", paused {self.paused} time(s)" if self.paused else "")
                + (f", joined {self.joined - self.arrived - self.waited:.3f} s after its place" if self.joined else ""))


class Stopping:
    """SIGINT/SIGTERM with requests open: uvicorn waits for every open connection before the front stops its engines,
    and a stream can last minutes. So the signal ends each stream now with vLLM's error event and ``[DONE]``, and
    answers each request still waiting for its model 503; then the front stops within seconds."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.halt: asyncio.Future[None] | None = None
        self.requests: SwitchPort | None = None
        self.streams = 0  # ended by it
        self.waiting = 0  # answered 503 by it

    def begin(self, requests: SwitchPort) -> None:
        """In the front's loop, as it starts."""
        self.loop, self.requests = asyncio.get_running_loop(), requests
        self.halt = self.loop.create_future()

    def halted(self) -> asyncio.Future[None]:
        assert self.halt is not None, "the front's lifespan begins it"
        return self.halt

    def signal(self) -> None:
        """From the signal handler: the rest runs in the front's loop."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        if self.halt is not None and not self.halt.done():
            self.halt.set_result(None)
            if self.requests is not None:
                self.waiting = self.requests.close()


async def relay_resumable(requests: SwitchPort, client: httpx.AsyncClient, stopping: Stopping, m: Model,
                          upstream: httpx.Response, said: Said, r: Resumable) -> AsyncGenerator[bytes, None]:
    """A stream relayed an event at a time, paused where ``r.pause`` is set (its engine leaves for another model's
    turn): the connection to the engine closed (vLLM aborts the request), its place in flight given back, the model
    waited for again as by a new request, and the answer continued from its text so far (``r.continuation``). Its
    client sees one stream. A continuation that cannot be made ends the stream with an error event."""
    relay = _Resumed(requests, client, m, said, r, upstream)
    try:
        while True:
            got = await relay.next(stopping)
            if got is None:
                return
            for event in got:
                yield event
            if relay.ended:
                return
            failed = await relay.paused()
            if failed:
                yield failed
                return
    except httpx.TransportError as exc:
        logger.warning("switch: %s: its engine's answer broke off (%s); the stream ends with an error event",
                       m.name, str(exc) or type(exc).__name__)
        yield stream_error(f"the engine of `{m.name}` stopped in the middle of this answer; retry the request")
    finally:
        await relay.close()


class _Resumed:
    """``relay_resumable``'s state: the engine's answer now (``upstream``), whether this request holds its place in
    flight, the events cut from the bytes."""

    def __init__(self, requests: SwitchPort, client: httpx.AsyncClient, m: Model, said: Said, r: Resumable,
                 upstream: httpx.Response) -> None:
        self.requests, self.client, self.m, self.said, self.r = requests, client, m, said, r
        self.upstream, self.chunks, self.events = upstream, upstream.aiter_raw(), Events()
        self.holding = True
        self.ended = False  # the front stopped: the stream's error event is the last
        self.step: asyncio.Future[bytes] | None = None  # the read in progress: a held stream keeps it (a read
        # cancelled midway would lose what it had)
        said.joined = time.monotonic()  # its arrival is on it since its place (``handlers.open_upstream``)
        m.entering.discard(r)
        m.streams.add(r)

    async def next(self, stopping: Stopping) -> list[bytes] | None:
        """The events to relay next ([] where a pause came first); None at the answer's end. The front stopping
        ends the stream with an error event."""
        if self.step is None:
            self.step = asyncio.ensure_future(anext(self.chunks))
        step = self.step
        pausing = asyncio.ensure_future(self.r.pause.wait())
        racing: set[asyncio.Future[Any]] = {step, pausing, stopping.halted()}
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        pausing.cancel()
        # a held stream needs no clean cut (nothing is continued), and reads on; a pause says which it is (it sets
        # ``keep`` first); one continued pauses at a clean cut once its prompt's token ids came: until then it reads on
        r = self.r
        if not step.done() and not (r.pause.is_set() and r.can_pause and (r.clean or r.keep)):
            await asyncio.wait(racing - {pausing}, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            if self.r.keep and not stopping.halted().done():  # read after the pause: it set ``keep`` first
                return []  # the read goes on: the next call awaits it
            self.step = None
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
            if stopping.halted().done():
                stopping.streams += 1
                self.ended = True
                self.said.outcome = "cut"
                return [stream_error("the server is shutting down; retry the request", 503)]
            return []
        self.step = None
        try:
            chunk = step.result()
        except StopAsyncIteration:
            return None
        out = []
        for event in self.events.feed(chunk):
            relayed = self.r.relayed(event)
            if relayed:
                self.said.seen(relayed)
                out.append(relayed)
        self.r.first_at = self.said.first
        return out

    async def paused(self) -> bytes:
        """A pause, where one is asked: held (its engine pauses it where it is, and it goes on at the next wake), or
        continued once its text is whole (``Resumable.clean``) and its prompt's token ids came (one asked before its
        first event pauses on it); one finished, or streaming what cannot be continued, ends in flight. b"" unless an
        error event ends the stream."""
        r = self.r
        if not r.pause.is_set():
            return b""
        if r.can_pause:
            if r.keep:
                return await self.hold()
            return await self.resume() if r.clean else b""
        if not r.may_pause:
            r.pause.clear()
        return b""

    async def hold(self) -> bytes:
        """Pause here with the connection to the engine kept open: its place in flight given back (the engine then
        parks, keeping this generation paused with its KV cache: ``upstream/parking.py``), the model
        waited for again as by a new request, and the answer read on from the same connection once it woke: nothing
        is computed again. b"" once it may read on, else the error event that ends the stream."""
        return await self._wait_again("held", "its KV cache kept; it goes on", "go on")

    async def resume(self) -> bytes:
        """Pause here and continue on the model's next wake: b"" once the continuation streams, else the error
        event that ends the stream."""
        m, r = self.m, self.r
        await self.upstream.aclose()
        failed = await self._wait_again("paused", "it continues", "continue")
        if failed:
            return failed
        try:
            self.upstream = await self.client.send(self.client.build_request(
                "POST", f"{m.engine.url}{COMPLETIONS}", content=r.continuation(),
                headers={"content-type": "application/json"}), stream=True)
        except httpx.TransportError as exc:
            return stream_error(f"the engine of `{m.name}` did not take this answer's continuation ({exc})")
        if self.upstream.status_code != 200:
            said = (await self.upstream.aread()).decode(errors="replace")[:300]
            return stream_error(f"the engine of `{m.name}` refused this answer's continuation "
                                f"({self.upstream.status_code}: {said})", self.upstream.status_code)
        self.chunks, self.events = self.upstream.aiter_raw(), Events()
        return b""

    async def _wait_again(self, how: str, then: str, could_not: str) -> bytes:
        """Its place in flight given back, and the model waited for again as by a new request (due by its next
        token's deadline): b"" once it has its place again, else the error event that ends the stream."""
        m, r = self.m, self.r
        r.pause.clear()
        self._let_go()
        r.paused += 1
        self.said.paused = r.paused
        logger.info("switch: %s: a stream %s after %d token(s); %s at the model's next wake", m.name, how, len(r.ids),
                    then)
        try:
            await self.requests.acquire(m.name, self.next_due())
        except Unavailable as exc:
            return stream_error(f"this answer was paused for another model and could not {could_not}: {exc}", 503)
        self.holding, r.moved = True, False
        m.streams.add(r)
        return b""

    def next_due(self) -> float:
        """When its next token is due (``turns.token_due``: the deadline schedule's; the others ignore it)."""
        return token_due(self.r.arrived, self.r.first_at, len(self.r.ids), self.requests.config)

    def _let_go(self) -> None:
        self.m.streams.discard(self.r)
        if self.holding:
            self.holding = False
            self.requests.release(self.m)

    async def close(self) -> None:
        self._let_go()  # first: a close cancelled at an await below still gives its place back
        if self.step is not None:
            self.step.cancel()
            await asyncio.gather(self.step, return_exceptions=True)
        await self.upstream.aclose()
