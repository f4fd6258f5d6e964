"""``hotweights switch``: one OpenAI-compatible port in front of an engine per model (``switcher.py`` decides which
is awake). ``/v1/completions`` and ``/v1/chat/completions`` (streamed or not) go to the engine of the request's
``model``, byte for byte; ``/v1/models`` lists every configured model; ``/health`` is 200 once the default
model serves; ``/metrics`` has the ``hotweights_switch_*`` series; ``/switch/status`` is what ``hotweights
switch status`` prints. The engines listen on loopback ports of their own; their ``/sleep`` and ``/wake_up``
are never reachable through the front. Errors are JSON in vLLM's shape. With an API key (``--api-key``, the
config's ``api_key``, else ``$VLLM_API_KEY``) every ``/v1`` and ``/switch`` path wants ``Authorization: Bearer
KEY``, as ``vllm serve --api-key`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..serve.errors import error_response as error
from .config import SwitchConfig
from .engines import gpu_mib_by_pid
from .metrics import SwitchMetrics
from .switcher import Switcher, Unavailable

logger = logging.getLogger("hotweights.switch")


def create_app(config: SwitchConfig, log_dir: Path | None = None) -> Starlette:
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="hotweights-switch-"))
    metrics = SwitchMetrics()
    switcher = Switcher(config, log_dir, metrics)
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

    def authorized(request: Request) -> bool:
        if not config.api_key:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {config.api_key}".encode())

    async def health(_request: Request) -> Response:
        if switcher.ready.is_set() and switcher.models[config.default.name].state != "failed":
            return Response(status_code=200)
        return error(503, f"the default model {config.default.name} is not serving yet")

    async def models(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Unauthorized")
        now = int(time.time())
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": now, "owned_by": "hotweights", "root": str(m.config.checkpoint),
             "parent": None, "permission": []} for name, m in switcher.models.items()]})

    async def status(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Unauthorized")
        gpu = await asyncio.to_thread(gpu_mib_by_pid)
        return JSONResponse({"default": config.default.name, "max_awake": config.max_awake, "log_dir": str(log_dir),
                             "models": [m.row(gpu) for m in switcher.models.values()]})

    async def scrape(_request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def forward(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Unauthorized")
        body = await request.body()
        try:
            name = json.loads(body).get("model")
        except (ValueError, AttributeError):
            return error(400, "the body must be a JSON object")
        if not isinstance(name, str) or name not in switcher.models:
            metrics.requests.labels(str(name)[:64], "unknown_model").inc()
            return error(404, f"The model `{name}` does not exist.", "model")
        try:
            m = await switcher.acquire(name)
        except Unavailable as exc:
            metrics.requests.labels(name, "unavailable").inc()
            return error(503, str(exc))
        try:
            upstream = await client.send(client.build_request(
                "POST", f"{m.engine.url}{request.url.path}", content=body,
                headers={"content-type": "application/json"}), stream=True)
        except httpx.HTTPError as exc:
            switcher.release(m)
            metrics.requests.labels(name, "unavailable").inc()
            return error(503, f"the engine of `{name}` did not answer ({exc}); it starts again on the next request")
        metrics.requests.labels(name, "served").inc()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                switcher.release(m)

        kept = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "cache-control")}
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncGenerator[None, None]:
        starting = asyncio.create_task(switcher.start_all())
        watching = asyncio.create_task(switcher.watch())
        try:
            yield
        finally:
            for task in (starting, watching):
                task.cancel()
            await asyncio.gather(starting, watching, return_exceptions=True)
            await client.aclose()
            await asyncio.to_thread(switcher.stop_all)
            logger.info("switch: every engine stopped")

    app = Starlette(lifespan=lifespan, routes=[
        Route("/health", health), Route("/metrics", scrape), Route("/v1/models", models),
        Route("/switch/status", status),
        Route("/v1/completions", forward, methods=["POST"]),
        Route("/v1/chat/completions", forward, methods=["POST"])])
    app.state.switcher = switcher
    return app


def run(config: SwitchConfig, log_dir: Path | None = None) -> int:
    """Serve until SIGINT/SIGTERM; every engine started is stopped on the way out."""
    import uvicorn

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per relayed request otherwise
    app = create_app(config, log_dir)
    names = ", ".join(m.name + (" (default)" if m is config.default else "") for m in config.models)
    logger.info("switch: http://%s:%d for %s; logs in %s", config.host, config.port, names,
                app.state.switcher.models[config.default.name].engine.log_path.parent)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           timeout_graceful_shutdown=30))
    server.run()
    return 0
