"""The HTTP side of ``hotweights serve``: Starlette routes of the OpenAI-compatible API.

Imported on a side thread while the model loads (``app.run``). Starlette (the ASGI toolkit
FastAPI is built on) with the pydantic bodies of ``schema``: about half FastAPI's import
time, and a start waits for it. Bad requests get OpenAI error objects with status 400.
"""

from __future__ import annotations

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

from .generate import Generator, SamplingParams
from .schema import BadRequest, ChatRequest, CompletionRequest, Sampling


def create_app(generator: Generator, model_name: str, on_start=None):
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if on_start is not None:
            on_start()  # the app starts serving right after this
        yield

    def error(status: int, message: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {
            "message": message, "type": "invalid_request_error", "param": param, "code": None}})

    def post(body: type[BaseModel], handle: Callable[[Any], Any]):
        """A POST route: the JSON body validated as ``body``, ``handle`` run on a worker thread (it generates)."""
        async def route(request: Request) -> Response:
            try:
                req = body.model_validate_json(await request.body())
            except ValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                param = ".".join(str(p) for p in first.get("loc", ())) or None
                return error(400, f"invalid request: {param + ': ' if param else ''}{first.get('msg', 'bad value')}",
                             param)
            try:
                result = await run_in_threadpool(handle, req)
            except BadRequest as exc:
                return error(400, str(exc), exc.param)
            return result if isinstance(result, Response) else JSONResponse(result)
        return route

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def models(_request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()), "owned_by": "hotweights",
            "max_model_len": generator.max_model_len}]})

    def prepare(req: Sampling, prompt_ids: list[int]) -> SamplingParams:
        if req.model not in (None, model_name):
            raise BadRequest(f"model {req.model!r} is not served here; this server serves {model_name!r}", "model")
        if req.n != 1:
            raise BadRequest("only n=1 is supported", "n")
        if req.logprobs or req.top_logprobs:
            raise BadRequest("logprobs are not supported by this server", "logprobs")
        room = generator.max_model_len - len(prompt_ids)
        if room < 1:
            raise BadRequest(f"prompt of {len(prompt_ids)} tokens leaves no room in max_model_len "
                             f"{generator.max_model_len}", "prompt")
        max_tokens = req.max_completion_tokens or req.max_tokens or room
        if max_tokens > room:
            raise BadRequest(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
                             f"{generator.max_model_len}", "max_tokens")
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        return SamplingParams(max_tokens, req.temperature, req.top_p, stop, req.seed)

    def respond(req: Sampling, prompt_ids: list[int], kind: str):
        params = prepare(req, prompt_ids)
        rid, created = f"{kind}-{uuid.uuid4().hex[:24]}", int(time.time())
        if req.stream:
            return StreamingResponse(_sse(generator, prompt_ids, params, rid, created, model_name, kind),
                                     media_type="text/event-stream")
        text, finish, count = "", None, 0
        for chunk in generator.stream(prompt_ids, params):
            text += chunk.text
            finish, count = chunk.finish_reason or finish, chunk.num_tokens
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if kind == "chatcmpl" else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
        return {"id": rid, "object": "chat.completion" if kind == "chatcmpl" else "text_completion",
                "created": created, "model": model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": count,
                          "total_tokens": len(prompt_ids) + count}}

    def completions(req: CompletionRequest):
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        if len(prompts) != 1:
            raise BadRequest("exactly one prompt per request is supported", "prompt")
        return respond(req, generator.encode(prompts[0]), "cmpl")

    def chat(req: ChatRequest):
        messages = [m.model_dump() for m in req.messages]
        if generator.tokenizer.chat_template:
            prompt = generator.tokenizer.apply_chat_template(messages)
        else:
            prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return respond(req, generator.encode(prompt), "chatcmpl")

    app = Starlette(lifespan=lifespan, routes=[
        Route("/health", health), Route("/v1/models", models),
        Route("/v1/completions", post(CompletionRequest, completions), methods=["POST"]),
        Route("/v1/chat/completions", post(ChatRequest, chat), methods=["POST"])])
    return app


def _sse(generator: Generator, prompt_ids: list[int], params: SamplingParams, rid: str, created: int,
         model_name: str, kind: str) -> Iterator[str]:
    obj = "chat.completion.chunk" if kind == "chatcmpl" else "text_completion"
    first = True
    for chunk in generator.stream(prompt_ids, params):
        if kind == "chatcmpl":
            delta = {"role": "assistant", "content": chunk.text} if first else {"content": chunk.text}
            choice = {"index": 0, "delta": delta, "finish_reason": chunk.finish_reason}
            first = False
        else:
            choice = {"index": 0, "text": chunk.text, "finish_reason": chunk.finish_reason, "logprobs": None}
        event = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice]}
        yield f"data: {json.dumps(event)}\n\n"
    yield "data: [DONE]\n\n"
