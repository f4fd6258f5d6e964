"""``hotweights serve``: an OpenAI-compatible server whose weights come through the cache.

Startup loads the tokenizer, builds the model on the meta device, attaches the weights
(or loads them from disk, by the fallback policy), runs one forward pass, and only then
starts serving: ``/health`` answers 200 only when the model can answer. One line then
gives every phase from process start (``startup: imports=... cuda_context=... tokenizer=...
model_build=... weights=... (source=...) warmup=... listening=... ready=...``). Bad requests get OpenAI error objects with status 400, never a 500.

Not covered: batching, logprobs, tools, n > 1, authentication (binds 127.0.0.1).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..config import AttachConfig
from .generate import Generator, SamplingParams
from .schema import BadRequest, ChatRequest, CompletionRequest, Sampling

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"
    device: str = "cpu"
    served_model_name: str | None = None
    max_model_len: int | None = None
    load_format: str = "hotweights"
    attach: AttachConfig = field(default_factory=AttachConfig)

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "hotweights"):
            raise ValueError(f"load_format must be 'auto' or 'hotweights', got {self.load_format!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


def process_age_s() -> float:
    """Seconds since this process started (the kernel's start time, so interpreter start-up counts)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def load(config: ServeConfig) -> tuple[Generator, dict[str, float]]:
    """Imports, CUDA context, tokenizer, model, weights, warm-up; returns the generator and
    each phase's seconds, measured from process start (``imports`` holds the interpreter too)."""
    from transformers import AutoTokenizer

    from ..engines.transformers import load_model

    t_imports = process_age_s()
    t0 = time.perf_counter()
    if config.device.startswith("cuda"):
        import torch

        torch.zeros(1, device=config.device)  # the CUDA context, on its own clock
    t1 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    t2 = time.perf_counter()
    model, report = load_model(config.model, dtype=config.dtype, device=config.device, config=config.attach,
                               load_format=config.load_format)
    t3 = time.perf_counter()
    limit = config.max_model_len or int(getattr(model.config, "max_position_embeddings", 2048))
    generator = Generator(model, tokenizer, max_model_len=limit)
    list(generator.stream(generator.encode("warm up"), SamplingParams(max_tokens=1, temperature=0)))
    t4 = time.perf_counter()
    timings = {"imports_s": t_imports, "cuda_context_s": t1 - t0, "tokenizer_s": t2 - t1,
               "model_build_s": report.build_s, "weights_s": report.weights_s, "warmup_s": t4 - t3,
               "source": str(report.source)}
    return generator, timings


def startup_line(timings: dict, listening_s: float, ready_s: float) -> str:
    """The one startup line: every phase from process start, the weights phase with its source."""
    return (f"startup: imports={timings['imports_s']:.2f}s cuda_context={timings['cuda_context_s']:.2f}s "
            f"tokenizer={timings['tokenizer_s']:.2f}s model_build={timings['model_build_s']:.2f}s "
            f"weights={timings['weights_s']:.3f}s (source={timings['source']}) warmup={timings['warmup_s']:.2f}s "
            f"listening={listening_s:.2f}s ready={ready_s:.2f}s (from process start)")


def create_app(generator: Generator, model_name: str, on_start=None):
    import contextlib

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if on_start is not None:
            on_start()  # the app starts serving right after this
        yield

    app = FastAPI(title="hotweights", version="1", lifespan=lifespan)

    def error(status: int, message: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {
            "message": message, "type": "invalid_request_error", "param": param, "code": None}})

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error(400, f"invalid request: {param}: {first.get('msg', 'bad value')}", param)

    @app.exception_handler(BadRequest)
    async def _bad(_request: Request, exc: BadRequest) -> JSONResponse:
        return error(400, str(exc), exc.param)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "hotweights", "max_model_len": generator.max_model_len}]}

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

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        if len(prompts) != 1:
            raise BadRequest("exactly one prompt per request is supported", "prompt")
        return respond(req, generator.encode(prompts[0]), "cmpl")

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest):
        messages = [m.model_dump() for m in req.messages]
        if getattr(generator.tokenizer, "chat_template", None):
            prompt = generator.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return respond(req, generator.encode(prompt), "chatcmpl")

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
        yield f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': model_name, 'choices': [choice]})}\n\n"
    yield "data: [DONE]\n\n"


def run(config: ServeConfig) -> int:
    import fastapi  # noqa: F401  (both now: a missing extra is one line before anything loads)
    import uvicorn

    # take the port before the model loads: a busy port is one line at once, not after a load
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {config.host}:{config.port} ({exc.strerror}): another process has the "
                         f"port; stop it or pass another --port") from None
    generator, timings = load(config)
    loaded = process_age_s()
    name = config.served_model_name or config.model

    def on_start() -> None:
        ready = process_age_s()
        logger.info(startup_line(timings, ready - loaded, ready))

    app = create_app(generator, name, on_start)
    logger.info("serving: model=%s url=http://%s:%d", name, config.host, config.port)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    return 0
