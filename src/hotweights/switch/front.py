"""``hotweights switch``: one OpenAI-compatible port in front of an engine per model (``switcher.py`` decides which
is awake). Every JSON path an engine may serve (``validate.RELAYED``: completions, chat, embeddings, responses,
tokenize, ...; streamed or not) goes to the engine of the request's ``model`` (or alias), byte for byte;
``/v1/models`` lists every configured model and alias; ``/health`` is 200 once the default model serves;
``/metrics`` has the ``hotweights_switch_*`` series; ``/switch/status`` is what ``hotweights switch status`` prints;
``POST /switch/models/NAME/{park,stop,start}`` are an operator's actions (``actions.py``); ``/ui`` is a status page
over the last two, in a browser (``page.html``). The engines listen on
loopback ports of their own; their ``/sleep`` and ``/wake_up`` are never reachable through the front. Errors are
JSON in vLLM's shape. With an API key (``--api-key``, the config's ``api_key``, else ``$VLLM_API_KEY``) every
``/v1`` and ``/switch`` path wants ``Authorization: Bearer KEY``, as ``vllm serve --api-key`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..serve.errors import error_response as error
from ..serve.errors import http_error, server_error, stream_error
from ..parked.records import take_port
from ..paths import daemon_paths
from .actions import ACTIONS, act
from .actions import Refused as ActionRefused
from .config import ModelConfig, SwitchConfig
from .engines import Engine, EngineLike, gpu_mib_by_pid
from .process import one_line
from .fit import say_fit
from .gpus import gpu_memory
from .kinds import KINDS
from .leftovers import Note, retire_left
from .metrics import SwitchMetrics
from .model import Model
from .states import ModelState
from .streams import Said, Stopping
from .switcher import Switcher, Unavailable
from .validate import BODIES, RELAYED, Refused, model_of

logger = logging.getLogger("hotweights.switch")
LOG_PATH = re.compile(r" \(log: [^)]*\)")  # an engine's log path in a failure's one line
PAGE = (Path(__file__).parent / "page.html").read_text()  # the status page (``/ui``)
SHUTDOWN_GRACE_S = 3  # uvicorn's wait for open connections on SIGINT/SIGTERM (its default: forever; ours was 30)


def create_app(config: SwitchConfig, log_dir: Path | None = None,  # noqa: C901, PLR0915
               engines: Callable[[ModelConfig], EngineLike] | None = None, note: Note | None = None) -> Starlette:
    """The front's app; ``engines`` makes a model's engine (default: its real server process, ``Engine``); ``note``
    keeps a note of their processes for the next front, should this one die (``leftovers.py``)."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="hotweights-switch-"))
    metrics = SwitchMetrics()
    switcher = Switcher(config, metrics, engines or (lambda m: Engine(m, log_dir, config.socket_dir, config.parking)),
                        {gpu: mem.total_mib for gpu, mem in gpu_memory().items()})
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
    stopping = Stopping()
    routes = {n: m.name for m in config.models for n in (m.name, *m.aliases)}  # every name a request may ask for

    def authorized(request: Request) -> bool:
        if not config.api_key:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {config.api_key}".encode())

    async def health(_request: Request) -> Response:
        if switcher.ready.is_set() and switcher.models[config.default.name].state is not ModelState.FAILED:
            return Response(status_code=200)
        return error(503, f"the default model {config.default.name} is not serving yet")

    async def models(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Unauthorized")
        now = int(time.time())
        return JSONResponse({"object": "list", "data": [
            {"id": asked, "object": "model", "created": now, "owned_by": "hotweights",
             "root": str(switcher.models[name].config.checkpoint), "parent": None if asked == name else name,
             "permission": []} for asked, name in routes.items()]})

    async def one_model(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Unauthorized")
        asked = request.path_params["name"]
        if asked not in routes:
            return error(404, f"The model `{asked}` does not exist. Valid models: {', '.join(routes)}.", "model")
        name = routes[asked]
        return JSONResponse({"id": asked, "object": "model", "created": int(time.time()), "owned_by": "hotweights",
                             "root": str(switcher.models[name].config.checkpoint),
                             "parent": None if asked == name else name, "permission": []})

    async def action(request: Request) -> Response:
        """``POST /switch/models/NAME/{park,stop,start}``: an operator's action on one model (``actions.py``)."""
        if not authorized(request):
            return error(401, "Unauthorized")
        asked, what = request.path_params["name"], request.path_params["action"]
        if asked not in routes:
            return error(404, f"The model `{asked}` does not exist. Valid models: {', '.join(routes)}.", "model")
        if what not in ACTIONS:
            return error(404, f"no action {what!r}: one of {', '.join(ACTIONS)}")
        m = switcher.models[routes[asked]]
        try:
            did = await act(switcher, m, what)
        except ActionRefused as exc:
            return error(409, str(exc))
        return JSONResponse({"model": m.name, "action": what, "did": did, "state": m.state.value})

    async def version(_request: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def status(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Unauthorized")
        gpu = await asyncio.to_thread(gpu_mib_by_pid)
        return JSONResponse({"default": config.default.name, "max_awake": config.max_awake or "auto",
                             "log_dir": str(log_dir), "version": __version__, "keyed": bool(config.api_key),
                             "models": [m.row(gpu).to_json() for m in switcher.models.values()],
                             "switches": [dataclasses.asdict(s) for s in reversed(switcher.switched)]})

    async def page(_request: Request) -> Response:
        """The status page: static, it holds no data; what it shows comes from ``/switch/status`` with the key."""
        return HTMLResponse(PAGE, headers={"cache-control": "no-store"})

    async def scrape(_request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def forward(request: Request) -> Response:
        if not authorized(request):
            return error(401, "Unauthorized")
        arrived = time.monotonic()
        body = await request.body()
        try:  # before anything parks for it
            asked = model_of(request.url.path, body, routes, config.default.name)
        except Refused as exc:
            metrics.requests.labels("", "refused").inc()
            return error(exc.status, str(exc), exc.param)
        name = routes[asked]
        if asked != name:  # an alias: its engine serves the model's name
            body = json.dumps({**json.loads(body), "model": name}).encode()
        opening = asyncio.create_task(open_upstream(name, request.url.path, body, arrived))
        gone = asyncio.create_task(disconnected(request))
        await asyncio.wait({opening, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not opening.done():  # the client left while its request waited or generated: cancel it upstream
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            metrics.requests.labels(name, "abandoned").inc()
            return Response(status_code=499)
        opened = opening.result()
        if isinstance(opened, Response):
            return opened
        m, upstream, waited = opened
        path = request.url.path
        unserved = upstream.status_code in (404, 405) and path not in BODIES  # a path its kind does not serve
        if unserved or (upstream.status_code >= 500 and "json" not in upstream.headers.get("content-type", "")):
            said = (await upstream.aread()).decode(errors="replace")  # every 5xx the front answers is JSON
            await upstream.aclose()
            switcher.release(m)
            metrics.requests.labels(name, f"engine_{upstream.status_code // 100}xx").inc()
            logger.info("switch: request %s %s %d, waited %.3f s", name, path, upstream.status_code, waited)
            if unserved:
                return error(404, f"the engine of `{name}` ({m.config.engine}) does not serve {path}")
            return error(upstream.status_code, f"the engine of `{name}` answered {upstream.status_code}: "
                                               f"{one_line(said or 'nothing', 300)}")
        code = upstream.status_code
        metrics.requests.labels(name, "ok" if code < 400 else f"engine_{code // 100}xx").inc()
        metrics.waited(name, waited)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "cache-control")}
        events = upstream.headers.get("content-type", "").startswith("text/event-stream")
        record = Said(name, path, code, arrived, waited)
        return StreamingResponse(relay(m, upstream, events, record), status_code=code, headers=kept)

    async def open_upstream(name: str, path: str, body: bytes,
                            arrived: float) -> Response | tuple[Model, httpx.Response, float]:
        """The engine's response to this request (its headers) and how long the request waited for its model, or the
        error the front answers. An engine found dead when its connection fails is started again for this request,
        once."""
        for attempt in (1, 2):
            try:
                m = await switcher.acquire(name)
            except Unavailable as exc:
                metrics.requests.labels(name, "unavailable").inc()
                return error(503, LOG_PATH.sub("", str(exc)))  # the server's paths are for its status, not clients
            waited = time.monotonic() - arrived
            sent = False
            try:
                upstream = await client.send(client.build_request(
                    "POST", f"{m.engine.url}{path}", content=body, headers={"content-type": "application/json"}),
                    stream=True)
                sent = True
                return m, upstream, waited
            except httpx.TransportError as exc:
                problem = str(exc) or type(exc).__name__
            finally:
                if not sent:  # failed, or cancelled because the client left
                    switcher.release(m)
            if attempt == 1 and await switcher.engine_died(m):
                logger.warning("switch: %s: its engine is gone (%s); starting it again for this request", name,
                               problem)
                continue
            metrics.requests.labels(name, "unavailable").inc()
            return error(503, f"the engine of `{name}` did not answer ({problem})")
        raise AssertionError("unreachable: the second attempt returns")

    async def relay(m: Model, upstream: httpx.Response, events: bool, said: Said) -> AsyncIterator[bytes]:
        """The engine's bytes as they come; an answer that breaks off (the engine died) ends a stream with an
        error event in vLLM's shape, and one line in the log; so does the front stopping (``Stopping``). Then the
        request's line (``Said``) and its first byte's time in the metrics."""
        tail = b"\n\n"
        chunks = upstream.aiter_raw()
        try:
            while True:
                step = asyncio.ensure_future(anext(chunks))
                racing: set[asyncio.Future[Any]] = {step, stopping.halted()}
                await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # the front stops: this answer ends now, not when the engine is done
                    step.cancel()
                    stopping.streams += 1
                    if events:
                        yield (b"" if tail == b"\n\n" else b"\n\n") + stream_error(
                            "the server is shutting down; retry the request", 503)
                    return
                try:
                    chunk = step.result()
                except StopAsyncIteration:
                    break
                tail = (tail + chunk)[-2:]
                said.seen(chunk)
                yield chunk
        except httpx.TransportError as exc:
            name = m.config.name
            logger.warning("switch: %s: its engine's answer broke off (%s)%s", name, str(exc) or type(exc).__name__,
                           "; the stream ends with an error event" if events else "")
            if events:
                yield (b"" if tail == b"\n\n" else b"\n\n") + stream_error(
                    f"the engine of `{name}` stopped in the middle of this answer; retry the request")
        finally:
            await upstream.aclose()
            switcher.release(m)
            if said.first:
                metrics.first_byte(said.name, said.first - said.arrived)
            m.relayed(said.first - said.arrived if said.first else None)
            logger.info(said.line())

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncGenerator[None, None]:
        stopping.begin(switcher)
        keeper_before = await asyncio.to_thread(keeper_pid, config.socket_dir)  # 0: this front's preloads start it
        scheduling = asyncio.create_task(switcher.run())
        watching = asyncio.create_task(switcher.watch())
        noting = asyncio.create_task(note.kept(lambda: {m.name: [m.engine.pid, m.engine.server]
                                                        for m in switcher.models.values()})) if note else None
        try:
            yield
        finally:
            if stopping.streams or stopping.waiting:
                logger.info("switch: stopping: %d stream(s) ended with an error event, %d waiting request(s) "
                            "answered 503", stopping.streams, stopping.waiting)
            tasks = [t for t in (scheduling, watching, noting) if t]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
            await switcher.stop_all()
            if note:
                note.close()
            logger.info("switch: every engine stopped")
            await asyncio.to_thread(leave_keeper, config, keeper_before)

    app = Starlette(lifespan=lifespan, exception_handlers={HTTPException: http_error, Exception: server_error}, routes=[
        Route("/health", health), Route("/metrics", scrape), Route("/v1/models", models), Route("/ui", page),
        Route("/", lambda _r: RedirectResponse("/ui")),
        Route("/switch/status", status), Route("/v1/models/{name:path}", one_model), Route("/version", version),
        Route("/switch/models/{name:path}/{action}", action, methods=["POST"]),
        *(Route(path, forward, methods=["POST"]) for path in RELAYED)])
    app.state.switcher, app.state.stopping = switcher, stopping
    return app


def keeper_pid(socket_dir: str) -> int:
    """The pid of the keeper answering in ``socket_dir`` (the default when ""), 0 when none does."""
    from ..client import connect
    from ..errors import HotweightsError

    try:
        with connect(daemon_paths(socket_dir or None)) as client:
            return client.status().pid
    except (HotweightsError, OSError):
        return 0


def leave_keeper(config: SwitchConfig, before: int) -> None:
    """On the way out: the keeper keeps the weights for the next start (said in one line); with ``stop_keeper`` a
    keeper this front's preloads started is stopped, its entries freed."""
    from ..client import connect

    pid = keeper_pid(config.socket_dir)
    if not pid:
        return
    if config.stop_keeper and pid != before:
        with connect(daemon_paths(config.socket_dir or None)) as client:
            client.stop()
        logger.info("switch: stopped the keeper this front started (pid %d): its weights are freed", pid)
        return
    ran = ", which ran before this front" if pid == before else ""
    logger.info("switch: the keeper (pid %d%s) keeps the weights, so that the next front starts at once; "
                "`hotweights stop` frees them%s", pid, ran, "" if ran else " (or run the front with --stop-keeper)")


async def disconnected(request: Request) -> None:
    """Returns when the client has gone (its body was read: what the server receives next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


LOG_PREFIX = "hotweights-switch-"
KEEP_RUNS, KEEP_S = 10, 7 * 86400.0


def new_log_dir(base: Path | None = None) -> Path:
    """A new temporary directory for this run's engine logs; of the earlier runs' (``LOG_PREFIX`` in ``base``, the
    system's temporary directory by default, ours), the ten newest stay, and the rest go once nothing in them has
    changed for a week (a front that still runs writes its engines' logs)."""
    base = base or Path(tempfile.gettempdir())
    made = Path(tempfile.mkdtemp(prefix=LOG_PREFIX, dir=base))

    def newest(d: Path) -> float:
        return max([d.stat().st_mtime, *(f.stat().st_mtime for f in d.iterdir())], default=0.0)

    try:
        runs = sorted((d for d in base.glob(LOG_PREFIX + "*") if d != made and d.is_dir() and not d.is_symlink()
                       and d.stat().st_uid == os.getuid()), key=newest, reverse=True)
        for old in runs[KEEP_RUNS - 1:]:
            if time.time() - newest(old) > KEEP_S:
                shutil.rmtree(old, ignore_errors=True)
    except OSError:  # another front's directory went meanwhile: tidying is never the reason a front does not start
        pass
    return made


def run(config: SwitchConfig, log_dir: Path | None = None) -> int:
    """Serve until SIGINT/SIGTERM; every engine started is stopped on the way out."""
    import uvicorn

    sock = take_port(config.host, config.port, config.socket_dir or None)  # before any engine starts
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per relayed request otherwise
    log_dir = log_dir or new_log_dir()
    config = dataclasses.replace(config, preload_jobs=config.jobs())  # auto: by the GPUs there are
    daemon_dir = daemon_paths(config.socket_dir or None).directory
    retire_left(daemon_dir)  # what a dead front left running, before this one starts its own
    app = create_app(config, log_dir, note=Note(daemon_dir))
    names = ", ".join(m.name + (" (default)" if m is config.default else "") for m in config.models)
    logger.info("switch: http://%s:%d for %s; logs in %s", config.host, config.port, names, log_dir)
    try:
        say_fit(config, lambda m: KINDS[m.engine].gpu_need(m), gpu_memory)  # before any engine: from its config
    except (OSError, ValueError) as exc:  # an estimate: never the reason a front does not start
        logger.info("switch: no estimate of what the models need of the GPU (%s)", exc)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            app.state.stopping.signal()  # open streams end now: uvicorn waits for them before the lifespan ends
            super().handle_exit(sig, frame)

    # a backstop: the streams end at the signal, a request waiting for its model gets its 503 at once
    Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                          timeout_graceful_shutdown=SHUTDOWN_GRACE_S)).run(sockets=[sock])
    return 0
