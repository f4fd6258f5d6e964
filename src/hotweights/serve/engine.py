"""The embedded server's engine thread: every generation runs on one thread, one job at a time.

A request submits a ``Job`` per choice and reads its chunks on the event loop; nothing holds a lock
across a ``yield``, so a client that goes away can never wedge the server (the bug this replaces: a
generator holding the decoder's lock was abandoned mid-stream by a dropped client, and every later
request waited on it forever). A job is cancelled when its client goes away (its request task is
cancelled, or the connection closes before the answer is ready) and when the server shuts down; the
engine thread checks before every decoding step, so a cancelled job frees the engine within one step.

Health: the engine can serve while its thread is alive, it is not shutting down, and no single job has
gone ``stall_s`` without a decoding step (``health`` says which, for ``/health``; time paused is not a stall).

A pause (``pause``, a park that keeps the generations in flight: ``park.py``) closes a gate the engine thread
passes before every decoding step and before every job: the job in flight stops between two steps, its KV cache
and its place in the answer kept in the thread, and the jobs queued behind it wait; ``resume`` opens the gate and
it goes on from the next step, nothing computed again.

Not covered: batching (jobs run one after another, in arrival order).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator

from .generate import Chunk, Generator, SamplingParams

logger = logging.getLogger(__name__)
STALL_S = 60.0  # a job with no decoding step for this long: /health says the engine cannot serve
_END = object()  # a job's last item when it ends without a finish reason (cancelled, shut down)


class Job:
    """One choice of one request: its prompt, its sampling, the chunks it made so far."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, loop: asyncio.AbstractEventLoop) -> None:
        self.prompt_ids, self.params = prompt_ids, params
        self.cancelled = threading.Event()
        self.finished = False  # the engine produced the last chunk (a finish reason)
        self._loop = loop
        self._items: asyncio.Queue[object] = asyncio.Queue()

    def cancel(self) -> None:
        self.cancelled.set()

    def put(self, item: object) -> None:
        """From the engine thread: hand ``item`` to the reader on the event loop."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody will read this job
            self.cancelled.set()

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The job's chunks as they come; ends after the last one, or early when the job ends without one.
        An engine error is raised here."""
        while True:
            item = await self._items.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Chunk)
            yield item
            if item.finish_reason is not None:
                return


class Engine:
    def __init__(self, generator: Generator, *, stall_s: float = STALL_S) -> None:
        self.generator = generator
        self.stall_s = stall_s
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._current: Job | None = None
        self._last_step = time.monotonic()
        self._stopping = False
        self._pending: set[Job] = set()
        self._pending_lock = threading.Lock()
        self._open = threading.Event()  # the gate: closed by a pause, opened by resume
        self._open.set()
        self._resting = threading.Event()  # the thread waits at the gate, or for a job: it runs no step now
        self._resting.set()
        self._thread = threading.Thread(target=self._run, name="hotweights engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Job:
        """Queue a job (from the event loop); a job submitted while stopping ends at once."""
        job = Job(prompt_ids, params, asyncio.get_running_loop())
        with self._pending_lock:
            if self._stopping:
                job.cancel()
                job.put(_END)
                return job
            self._pending.add(job)
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        """Cancel every job, refuse new ones, let the thread end (a shutdown: within one step)."""
        with self._pending_lock:
            self._stopping = True
            pending = list(self._pending)
        for job in pending:
            job.cancel()
        self._jobs.put(None)

    def pause(self, timeout_s: float) -> bool:
        """Close the gate and wait until the engine thread runs no decoding step (it waits at the gate, or for a
        job); the job in flight keeps its state. False after ``timeout_s`` (the gate opened again)."""
        self._open.clear()
        self._resting.clear()
        if self._current is None and self._jobs.empty():
            self._resting.set()  # idle: the next job waits at the gate before its first step
        if self._resting.wait(timeout_s):
            return True
        self.resume()
        return False

    def resume(self) -> None:
        """Open the gate: the paused job goes on from its next step."""
        self._last_step = time.monotonic()  # a pause is not a stall
        self._open.set()

    def _gate(self, job: Job) -> None:
        """Wait here while paused (a job cancelled meanwhile, or a stop, goes on at once: to its end)."""
        while not self._open.is_set() and not self._stopping and not job.cancelled.is_set():
            self._resting.set()
            self._open.wait(0.05)
        self._resting.clear()  # a step may run from here: a pause now waits for the next gate

    def wait_idle(self, timeout_s: float) -> bool:
        """Until no job runs or waits (a park drains the engine first); False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._current is not None or not self._jobs.empty():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def health(self) -> str | None:
        """None when the engine can serve, else why not (one line)."""
        if self._stopping:
            return "the server is shutting down"
        if not self._thread.is_alive():
            return "the engine thread has ended (see the server log)"
        stalled = time.monotonic() - self._last_step
        if self._current is not None and stalled > self.stall_s:
            return f"the engine has made no decoding step for {stalled:.0f} s"
        return None

    def _beat(self, job: Job) -> bool:
        """Called before every decoding step: True when ``job`` should stop. Waits at the gate while paused."""
        self._gate(job)
        self._last_step = time.monotonic()
        return job.cancelled.is_set()

    def _run(self) -> None:
        while True:
            self._resting.set()  # waiting for a job runs no step
            job = self._jobs.get()
            if job is None:
                break
            self._current, self._last_step = job, time.monotonic()
            self._gate(job)
            try:
                if not job.cancelled.is_set():
                    for chunk in self.generator.stream(job.prompt_ids, job.params,
                                                       should_stop=lambda j=job: self._beat(j)):
                        job.finished = chunk.finish_reason is not None
                        job.put(chunk)
            except Exception as exc:  # one request's failure is its own, the engine goes on
                logger.exception("generation failed: prompt_tokens=%d", len(job.prompt_ids))
                job.put(exc)
            finally:
                if not job.finished:
                    job.put(_END)
                self._current = None
                with self._pending_lock:
                    self._pending.discard(job)
        with self._pending_lock:  # stopped: whatever was still queued ends unanswered
            for job in self._pending:
                job.put(_END)
