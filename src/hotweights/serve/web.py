"""The HTTP side of ``hotweights serve``: Starlette routes of the OpenAI-compatible API.

Imported on a side thread while the model loads (``app.run``). Starlette (the ASGI toolkit
FastAPI is built on) with the pydantic bodies of ``schema``: about half FastAPI's import
time, and a start waits for it. Bad requests get OpenAI error objects with status 400 (404 for a
model this server does not serve), naming the field; ``schema`` says what is served.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

# uvicorn's protocol modules too, so that starting to listen imports nothing
import uvicorn  # noqa: F401
import uvicorn.lifespan.on  # noqa: F401
import uvicorn.protocols.http.auto  # noqa: F401
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from .generate import Chunk, Generator, SamplingParams
from .metrics import ServerMetrics
from .schema import BadRequest, ChatRequest, CompletionRequest, Sampling


def create_app(generator: Generator, model_name: str, on_start=None, metrics: ServerMetrics | None = None):
    import contextlib

    metrics = metrics or ServerMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if on_start is not None:
            on_start()  # the app starts serving right after this
        yield

    def error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {
            "message": message, "type": "invalid_request_error", "param": param, "code": code}})

    def post(body: type[BaseModel], handle: Callable[[Any], Any]):
        """A POST route: the JSON body validated as ``body``, ``handle`` run on a worker thread (it generates)."""
        async def route(request: Request) -> Response:
            response = await answer(request)
            metrics.requests.labels(request.url.path, str(response.status_code)).inc()
            return response

        async def answer(request: Request) -> Response:
            try:
                req = body.model_validate_json(await request.body())
            except ValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                param = ".".join(str(p) for p in first.get("loc", ())) or None
                if first.get("type") == "extra_forbidden":
                    return error(400, f"{param} is not a field this server reads (refused rather than ignored)",
                                 param)
                return error(400, f"invalid request: {param + ': ' if param else ''}{first.get('msg', 'bad value')}",
                             param)
            try:
                result = await run_in_threadpool(handle, req)
            except BadRequest as exc:
                return error(exc.status, str(exc), exc.param, exc.code)
            return result if isinstance(result, Response) else JSONResponse(result)
        return route

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def scrape(_request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def version(_request: Request) -> JSONResponse:
        return JSONResponse({"version": __version__, "server": "hotweights"})

    async def models(_request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()), "owned_by": "hotweights",
            "max_model_len": generator.max_model_len}]})

    def prepare(req: Sampling, prompt_ids: list[int], choice: int) -> SamplingParams:
        room = generator.max_model_len - len(prompt_ids)
        if room < 1:
            raise BadRequest(f"prompt of {len(prompt_ids)} tokens leaves no room in max_model_len "
                             f"{generator.max_model_len}", "prompt")
        max_tokens = req.max_completion_tokens or req.max_tokens or room
        if max_tokens > room:
            raise BadRequest(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
                             f"{generator.max_model_len}", "max_tokens")
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        seed = None if req.seed is None else req.seed + choice  # n samples, each reproducible
        return SamplingParams(max_tokens, 1.0 if req.temperature is None else req.temperature,
                              1.0 if req.top_p is None else req.top_p, stop, seed, max(0, req.top_k or 0),
                              req.presence_penalty or 0.0, req.frequency_penalty or 0.0,
                              tuple(req.bias(generator.vocab_size).items()))

    def respond(req: Sampling, prompts: list[tuple[list[int], str]], kind: str):
        """``prompts``: each prompt's ids and the text an echo shows; ``req.n`` choices of each."""
        if req.model not in (None, model_name):
            raise BadRequest(f"The model {req.model!r} does not exist; this server serves {model_name!r}", "model",
                             status=404, code="model_not_found")
        req.refuse_unserved()
        jobs = [(i * req.n + j, ids, echo, prepare(req, ids, j))
                for i, (ids, echo) in enumerate(prompts) for j in range(req.n)]
        rid, created = f"{kind}-{uuid.uuid4().hex[:24]}", int(time.time())
        prompt_tokens = sum(len(ids) for ids, _ in prompts)
        metrics.prompt_tokens.inc(prompt_tokens)
        clock = _Clock(metrics)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_sse(generator, jobs, rid, created, model_name, kind, usage, prompt_tokens,
                                          clock), media_type="text/event-stream")
        choices, completion_tokens = [], 0
        for index, ids, echo, params in jobs:
            text, finish, count = echo, None, 0
            for chunk in generator.stream(ids, params):
                clock.chunk()
                text += chunk.text
                finish, count = chunk.finish_reason or finish, chunk.num_tokens
            completion_tokens += count
            choices.append({"index": index, "message": {"role": "assistant", "content": text},
                            "finish_reason": finish} if kind == "chatcmpl" else
                           {"index": index, "text": text, "finish_reason": finish, "logprobs": None})
        clock.done(completion_tokens)
        return {"id": rid, "object": "chat.completion" if kind == "chatcmpl" else "text_completion",
                "created": created, "model": model_name, "choices": choices,
                "usage": _usage(prompt_tokens, completion_tokens)}

    def completions(req: CompletionRequest):
        prompts = []
        for p in req.prompts(generator.vocab_size):
            ids = generator.encode(p) if isinstance(p, str) else p
            text = (p if isinstance(p, str) else generator.tokenizer.decode(p)) if req.echo else ""
            prompts.append((ids, text))
        return respond(req, prompts, "cmpl")

    def chat(req: ChatRequest):
        messages = req.dialog()
        if generator.tokenizer.chat_template:
            prompt = generator.tokenizer.apply_chat_template(messages)
        else:
            prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return respond(req, [(generator.encode(prompt), "")], "chatcmpl")

    app = Starlette(lifespan=lifespan, routes=[
        Route("/health", health), Route("/version", version), Route("/metrics", scrape), Route("/v1/models", models),
        Route("/v1/completions", post(CompletionRequest, completions), methods=["POST"]),
        Route("/v1/chat/completions", post(ChatRequest, chat), methods=["POST"])])
    return app


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class _Clock:
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


def _sse(generator: Generator, jobs: list[tuple[int, list[int], str, SamplingParams]], rid: str, created: int,
         model_name: str, kind: str, usage: bool, prompt_tokens: int, clock: _Clock) -> Iterator[str]:
    """Server-sent events: each choice's chunks in turn (its index on each), then the usage when asked."""
    obj = "chat.completion.chunk" if kind == "chatcmpl" else "text_completion"

    def event(choices: list[dict], **extra: Any) -> str:
        return "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model_name,
                                      "choices": choices, **({"usage": None} if usage else {}), **extra}) + "\n\n"

    completion_tokens = 0
    for index, ids, echo, params in jobs:
        first = True
        for chunk in itertools.chain([Chunk(echo)] if echo else [], generator.stream(ids, params)):
            clock.chunk()
            if kind == "chatcmpl":
                delta = {"role": "assistant", "content": chunk.text} if first else {"content": chunk.text}
                choice = {"index": index, "delta": delta, "finish_reason": chunk.finish_reason}
            else:
                choice = {"index": index, "text": chunk.text, "finish_reason": chunk.finish_reason, "logprobs": None}
            first = False
            completion_tokens += chunk.num_tokens if chunk.finish_reason else 0
            yield event([choice])
    clock.done(completion_tokens)
    if usage:
        yield event([], usage=_usage(prompt_tokens, completion_tokens))
    yield "data: [DONE]\n\n"
