"""The answers of the OpenAI-compatible endpoints, made from the engine's jobs (``engine.py``): a plain
answer collected while the client stays, a stream of server-sent events that cancels its jobs however it
ends (one event per token, a chat stream's first one naming the role, as vLLM sends them), logprobs in
OpenAI's two shapes, the usage, and each request's time to first token and end-to-end latency.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .engine import Job
from .generate import Chunk, Logprob, SamplingParams
from .metrics import ServerMetrics


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated request: what to generate (each choice's index, prompt ids, echo and sampling) and how to
    answer."""

    jobs: list[tuple[int, list[int], str, SamplingParams]]
    kind: str  # "cmpl" | "chatcmpl"
    stream: bool
    usage: bool  # a streamed last chunk with the usage
    prompt_tokens: int
    rid: str
    created: int
    token_ids: bool = False  # the prompt's token ids and each chunk's, in vLLM's fields (``return_token_ids``)


Decode = Callable[[list[int]], str]


def completion_logprobs(scored: list[Logprob], decode: Decode, offset: int = 0) -> dict[str, list[Any]]:
    """A completion choice's ``logprobs``: each token's text, logprob and offset in the choice's text, and
    the step's most likely tokens with the chosen one always among them (up to k + 1, as OpenAI says)."""
    tokens = [decode([s.token]) for s in scored]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    # keyed by text, as OpenAI's shape is: tokens that decode alike share a key; the chosen one's value wins
    top = [{**{decode([t]): lp for t, lp in s.top}, text: s.logprob} for s, text in zip(scored, tokens)]
    return {"text_offset": offsets, "token_logprobs": [s.logprob for s in scored], "tokens": tokens,
            "top_logprobs": top}


def chat_logprobs(scored: list[Logprob], decode: Decode) -> dict[str, list[Any]]:
    """A chat choice's ``logprobs``: ``content``, one entry per token with its bytes and the step's top k."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(s.token, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}
                        for s in scored]}


def logprobs_of(kind: str, chunks: list[Chunk], decode: Decode, offset: int = 0) -> dict[str, list[Any]]:
    scored = [lp for c in chunks for lp in c.logprobs]
    return chat_logprobs(scored, decode) if kind == "chatcmpl" else completion_logprobs(scored, decode, offset)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Clock:
    """One request's time to first token and end-to-end latency, from its arrival."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics, self.start, self.first = metrics, time.perf_counter(), True

    def chunk(self) -> None:
        if self.first:
            self.metrics.ttft.observe(time.perf_counter() - self.start)
            self.first = False

    def done(self, generated: int) -> None:
        self.metrics.e2e.observe(time.perf_counter() - self.start)
        self.metrics.generation_tokens.inc(generated)


class JobStream(StreamingResponse):
    """A streamed answer that cancels its jobs however it ends: finished, client gone, server stopping."""

    def __init__(self, jobs: list[Job], content: AsyncIterator[str], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.jobs = jobs

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for job in self.jobs:
                job.cancel()


async def collect(request: Request, jobs: list[Job], on_chunk: Callable[[], None]) -> list[list[Chunk]] | None:
    """Every job's chunks, or None when the client disconnects first (then every job is cancelled)."""
    async def gather() -> list[list[Chunk]]:
        out: list[list[Chunk]] = []
        for job in jobs:
            out.append([])
            async for chunk in job.chunks():
                on_chunk()
                out[-1].append(chunk)
        return out

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answer, gone = asyncio.ensure_future(gather()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        return answer.result() if answer.done() else None
    finally:
        for job in jobs:
            job.cancel()
        answer.cancel()
        gone.cancel()


async def sse(plan: Plan, jobs: list[Job], model_name: str, clock: Clock, decode: Decode) -> AsyncIterator[str]:
    """Server-sent events: each choice's chunks in turn (its index on each), then the usage when asked. A
    stream cut short by a shutdown ends without ``[DONE]``."""
    obj = "chat.completion.chunk" if plan.kind == "chatcmpl" else "text_completion"

    def event(choices: list[dict], **extra: Any) -> str:
        return "data: " + json.dumps({"id": plan.rid, "object": obj, "created": plan.created, "model": model_name,
                                      "choices": choices, **({"usage": None} if plan.usage else {}),
                                      **extra}) + "\n\n"

    completion_tokens = 0
    for (index, prompt_ids, echo, params), job in zip(plan.jobs, jobs):
        finished, offset = False, 0
        ids = {"prompt_token_ids": prompt_ids} if plan.token_ids else {}  # on the first chunk of the choice
        if plan.kind == "chatcmpl":
            yield event([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}], **ids)
            ids = {}
        async for chunk in with_echo(echo, job.chunks()):
            clock.chunk()
            logprobs = None if params.logprobs is None else logprobs_of(plan.kind, [chunk], decode, offset)
            if plan.kind == "chatcmpl":
                choice = {"index": index, "delta": {"content": chunk.text}, "logprobs": logprobs,
                          "finish_reason": chunk.finish_reason}
            else:
                choice = {"index": index, "text": chunk.text, "logprobs": logprobs,
                          "finish_reason": chunk.finish_reason, **ids}
                ids = {}
                if logprobs and logprobs["tokens"]:  # by the tokens reported: held-back text lags them
                    offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
            if plan.token_ids:
                choice["token_ids"] = list(chunk.token_ids)
            finished = chunk.finish_reason is not None
            completion_tokens += chunk.num_tokens if chunk.finish_reason else 0
            yield event([choice])
        if not finished:
            return
    clock.done(completion_tokens)
    if plan.usage:
        yield event([], usage=usage(plan.prompt_tokens, completion_tokens))
    yield "data: [DONE]\n\n"


async def with_echo(echo: str, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    if echo:
        yield Chunk(echo)
    async for chunk in chunks:
        yield chunk
