"""The front's routes (``front.py`` makes the app): module-level handlers over ``FrontState``, which the app keeps in
``app.state.front``, as vLLM's API server keeps its engine client. Every JSON path an engine may serve
(``validate.RELAYED``) goes to the engine of the request's ``model`` (or alias), byte for byte (``forward``); the
rest are the front's own: ``/health``, ``/metrics``, ``/v1/models``, ``/version``, ``/switch/status``, the operator's
actions and the status page (``/ui``). Torch-free."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from ... import __version__
from ...openai_errors import error_response as error
from ...openai_errors import stream_error
from ..actions import ACTIONS
from ..actions import Refused as ActionRefused
from ..config import ConfigError, SwitchConfig
from ..running import ConfigSource, started_when_asked
from ..upstream.engines import gpu_mib_by_pid
from ..metrics import SwitchMetrics
from ..model import Model
from ..upstream.process import one_line
from ..preempt import Resumable, resumable
from .streams import Said, Stopping, relay_resumable
from ..door import SwitchPort, Unavailable
from .validate import BODIES, RELAYED, Refused, keep_alive_of, model_of

logger = logging.getLogger("hotweights.switch")
LOG_PATH = re.compile(r" \(log: [^)]*\)")  # an engine's log path in a failure's one line
PAGE = (Path(__file__).parent / "page.html").read_text()  # the status page (``/ui``)


@dataclass
class FrontState:
    """What the handlers share: the switcher, its config and metrics, the one HTTP client to the engines, the
    stop of open streams, every name a request may ask for (``routes``: a model's name or alias -> the model)."""

    config: SwitchConfig
    switcher: SwitchPort
    metrics: SwitchMetrics
    client: httpx.AsyncClient
    stopping: Stopping
    log_dir: Path
    source: ConfigSource | None = None  # where its configuration is read again (a reload), None: the quick form
    routes: dict[str, str] = dataclasses.field(default_factory=dict)
    reloading: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # one reload at a time

    def __post_init__(self) -> None:
        self._route()

    def _route(self) -> None:
        """Every name a request may ask for (a model's name or alias) -> the model, from the config it runs."""
        self.routes = {n: m.name for m in self.config.models for n in (m.name, *m.aliases)}

    async def reload(self, why: str) -> tuple[int, dict[str, Any]]:
        """The configuration read again and run (``SwitchPort.reload``): added models start, removed ones stop,
        changed ones start again, the others are untouched; a configuration it cannot run is refused in one line
        and the running one stays. The HTTP status and what it did, as ``/switch/reload`` answers them."""
        if self.source is None:  # SIGHUP too: said, and the front goes on (it used to end it)
            logger.warning("switch: reload (%s): this front was started without --config: nothing to read again", why)
            return 400, {"error": "this front was started without --config: there is no file to read again"}
        async with self.reloading:
            try:
                read = started_when_asked(await asyncio.to_thread(self.source.read))[0]  # as the front began
                self.config, change = await self.switcher.reload(read)
            except ConfigError as exc:
                logger.warning("switch: reload (%s) refused: %s", why, exc)
                return 400, {"error": f"reload refused: {exc}"}
        self._route()
        logger.info("switch: reloaded %s (%s): %s", self.source.path, why, change.line())
        return 200, dataclasses.asdict(change)

    def authorized(self, request: Request) -> bool:
        if not self.config.api_key:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.config.api_key}".encode())


def front(request: Request) -> FrontState:
    state: FrontState = request.app.state.front
    return state


def routes() -> list[Route]:
    return [Route("/health", health), Route("/metrics", scrape), Route("/v1/models", models), Route("/ui", page),
            Route("/", lambda _r: RedirectResponse("/ui")), Route("/switch/status", status),
            Route("/v1/models/{name:path}", one_model), Route("/version", version),
            Route("/switch/models/{name:path}/{action}", action, methods=["POST"]),
            Route("/switch/reload", reload, methods=["POST"]),
            Route("/switch/unload", unload, methods=["POST"]),
            *(Route(path, forward, methods=["POST"]) for path in RELAYED)]


async def health(request: Request) -> Response:
    f = front(request)
    ok, said = f.switcher.health()  # why not, in JSON: the default model, its state, the reason (issue 68)
    return JSONResponse(said, status_code=200 if ok else 503)


async def models(request: Request) -> Response:
    f = front(request)
    if not f.authorized(request):
        return error(401, "Unauthorized")
    now = int(time.time())
    return JSONResponse({"object": "list", "data": [
        {"id": asked, "object": "model", "created": now, "owned_by": "hotweights",
         "root": str(f.switcher.models[name].config.checkpoint), "parent": None if asked == name else name,
         "permission": []} for asked, name in f.routes.items()]})


async def one_model(request: Request) -> Response:
    f = front(request)
    if not f.authorized(request):
        return error(401, "Unauthorized")
    asked = request.path_params["name"]
    if asked not in f.routes:
        return error(404, f"The model `{asked}` does not exist. Valid models: {', '.join(f.routes)}.", "model")
    name = f.routes[asked]
    return JSONResponse({"id": asked, "object": "model", "created": int(time.time()), "owned_by": "hotweights",
                         "root": str(f.switcher.models[name].config.checkpoint),
                         "parent": None if asked == name else name, "permission": []})


async def action(request: Request) -> Response:
    """``POST /switch/models/NAME/{park,stop,start}``: an operator's action on one model (``actions.py``)."""
    f = front(request)
    if not f.authorized(request):
        return error(401, "Unauthorized")
    asked, what = request.path_params["name"], request.path_params["action"]
    if asked not in f.routes:
        return error(404, f"The model `{asked}` does not exist. Valid models: {', '.join(f.routes)}.", "model")
    if what not in ACTIONS:
        return error(404, f"no action {what!r}: one of {', '.join(ACTIONS)}")
    m = f.switcher.models[f.routes[asked]]
    try:
        did = await f.switcher.act(m.name, what)
    except ActionRefused as exc:
        return error(409, str(exc))
    return JSONResponse({"model": m.name, "action": what, "did": did, "state": m.state.value})


async def reload(request: Request) -> Response:
    """``POST /switch/reload``: the front's configuration file read again and run (``FrontState.reload``)."""
    f = front(request)
    if not f.authorized(request):
        return error(401, "Unauthorized")
    code, said = await f.reload("POST /switch/reload")
    return JSONResponse(said, status_code=code) if code == 200 else error(code, said["error"])


async def unload(request: Request) -> Response:
    """``POST /switch/unload``: every model's engine stopped (llama-swap's ``/unload``); a request for one starts it
    again."""
    f = front(request)
    if not f.authorized(request):
        return error(401, "Unauthorized")
    return JSONResponse({"stopped": await f.switcher.unload()})


async def version(request: Request) -> Response:
    return JSONResponse({"version": __version__})


async def status(request: Request) -> Response:
    f = front(request)
    if not f.authorized(request):
        return error(401, "Unauthorized")
    gpu = await asyncio.to_thread(gpu_mib_by_pid)
    return JSONResponse({"default": f.config.default.name, "max_awake": f.config.max_awake,
                         "parking": f.config.parking, "log_dir": str(f.log_dir), "version": __version__,
                         "keyed": bool(f.config.api_key), **f.switcher.status(gpu)})


async def page(request: Request) -> Response:
    """The status page: static, it holds no data; what it shows comes from ``/switch/status`` with the key."""
    return HTMLResponse(PAGE, headers={"cache-control": "no-store"})


async def scrape(request: Request) -> Response:
    f = front(request)
    return Response(generate_latest(f.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def forward(request: Request) -> Response:
    f = front(request)
    if not f.authorized(request):
        return error(401, "Unauthorized")
    arrived = time.monotonic()
    body = await request.body()
    try:  # before anything parks for it
        asked = model_of(request.url.path, body, f.routes, f.config.default.name)
        keep_alive = keep_alive_of(body)
    except Refused as exc:  # a line in the request log too, as a relayed request has
        f.metrics.requests.labels("", "refused").inc()
        logger.info("switch: request %s %d, refused: %s", request.url.path, exc.status, exc)
        return error(exc.status, str(exc), exc.param)
    name = f.routes[asked]
    if keep_alive is not None:  # Ollama's: how long this model stays awake once idle, from now on
        f.switcher.keep_alive(name, keep_alive)
    if asked != name:  # an alias: its engine serves the model's name
        body = json.dumps({**json.loads(body), "model": name}).encode()
    r = resumable(request.url.path, body) if f.config.preempt else None  # a stream that may be paused
    opening = asyncio.create_task(open_upstream(f, name, request.url.path, r.first_body() if r else body, arrived, r))
    gone = asyncio.create_task(disconnected(request))
    await asyncio.wait({opening, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not opening.done():  # the client left while its request waited or generated: cancel it upstream
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)
        f.metrics.requests.labels(name, "abandoned").inc()
        return Response(status_code=499)
    opened = opening.result()
    if isinstance(opened, Response):
        return opened
    m, upstream, waited = opened
    path = request.url.path
    if (answered := await _answered_here(f, m, upstream, path, waited)) is not None:
        return answered
    code = upstream.status_code
    if code >= 400:  # else counted at its answer's end, by how it ended (``_told``)
        f.metrics.requests.labels(name, f"engine_{code // 100}xx").inc()
    f.metrics.waited(name, waited)
    kept = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "cache-control")}
    events = upstream.headers.get("content-type", "").startswith("text/event-stream")
    record = Said(name, path, code, arrived, waited)
    if r is not None and events and code == 200:  # a stream the switch may pause for another model's turn
        stream = relay_resumable(f.switcher, f.client, f.stopping, m, upstream, record, r)
        return StreamingResponse(told(f, m, stream, record), status_code=code, headers=kept)
    return StreamingResponse(relay(f, m, upstream, events, record), status_code=code, headers=kept)


async def _answered_here(f: FrontState, m: Model, upstream: httpx.Response, path: str,
                         waited: float) -> Response | None:
    """The front's own answer where the engine's is not relayed: a 404 of its own for a path the engine's kind does
    not serve (counted ``unserved``), a plain-text 5xx as JSON; None where the engine's answer goes through."""
    name = m.name
    unserved = upstream.status_code in (404, 405) and path not in BODIES  # a path its kind does not serve
    if not unserved and (upstream.status_code < 500 or "json" in upstream.headers.get("content-type", "")):
        return None
    said = (await upstream.aread()).decode(errors="replace")  # every 5xx the front answers is JSON
    await upstream.aclose()
    f.switcher.release(m)
    f.metrics.requests.labels(name, "unserved" if unserved else f"engine_{upstream.status_code // 100}xx").inc()
    logger.info("switch: request %s %s %d, waited %.3f s", name, path, upstream.status_code, waited)
    if unserved:
        return error(404, f"the engine of `{name}` ({m.config.engine}) does not serve {path}")
    return error(upstream.status_code, f"the engine of `{name}` answered {upstream.status_code}: "
                                       f"{one_line(said or 'nothing', 300)}")


async def open_upstream(f: FrontState, name: str, path: str, body: bytes, arrived: float,
                        r: Resumable | None = None) -> Response | tuple[Model, httpx.Response, float]:
    """The engine's response to this request (its headers) and how long the request waited for its model, or the
    error the front answers. An engine found dead when its connection fails is started again for this request,
    once. ``r``, a stream that may pause, is among its model's ``entering`` on its way to the engine."""
    for attempt in (1, 2):
        try:
            m = await f.switcher.acquire(name)
        except Unavailable as exc:
            f.metrics.requests.labels(name, "unavailable").inc()
            return error(503, LOG_PATH.sub("", str(exc)))  # the server's paths are for its status, not clients
        waited = time.monotonic() - arrived
        sent = False
        if r is not None:
            r.arrived = arrived
            m.entering.add(r)
        try:
            upstream = await f.client.send(f.client.build_request(
                "POST", f"{m.engine.url}{path}", content=body, headers={"content-type": "application/json"}),
                stream=True)
            sent = True
            return m, upstream, waited
        except httpx.TransportError as exc:
            problem = str(exc) or type(exc).__name__
        finally:
            if not sent:  # failed, or cancelled because the client left
                f.switcher.release(m)
                if r is not None:
                    m.entering.discard(r)
        if attempt == 1 and await f.switcher.engine_gone(m):
            logger.warning("switch: %s: its engine is gone (%s); starting it again for this request", name,
                           problem)
            continue
        f.metrics.requests.labels(name, "unavailable").inc()
        logger.warning("switch: request %s %s 503: its engine did not answer (%s), waited %.3f s", name, path,
                       problem, waited)
        return error(503, f"the engine of `{name}` did not answer ({problem})")
    raise AssertionError("unreachable: the second attempt returns")


async def relay(f: FrontState, m: Model, upstream: httpx.Response, events: bool, said: Said) -> AsyncIterator[bytes]:
    """The engine's bytes as they come; an answer that breaks off (the engine died) ends a stream with an
    error event in vLLM's shape, and one line in the log; so does the front stopping (``Stopping``). Then the
    request's line (``Said``) and its first byte's time in the metrics."""
    tail = b"\n\n"
    chunks = upstream.aiter_raw()
    step: asyncio.Future[bytes] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(chunks))
            racing: set[asyncio.Future[Any]] = {step, f.stopping.halted()}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():  # the front stops: this answer ends now, not when the engine is done
                step.cancel()
                f.stopping.streams += 1
                said.outcome = "cut"
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
    except (GeneratorExit, asyncio.CancelledError):  # its client left
        said.outcome = "abandoned"
        raise
    except httpx.TransportError as exc:
        said.outcome = "broken"
        name = m.config.name
        logger.warning("switch: %s: its engine's answer broke off (%s)%s", name, str(exc) or type(exc).__name__,
                       "; the stream ends with an error event" if events else "")
        if events:
            yield (b"" if tail == b"\n\n" else b"\n\n") + stream_error(
                f"the engine of `{name}` stopped in the middle of this answer; retry the request")
    finally:
        if step is not None and not step.done():  # its read of the engine's next bytes goes with it, unawaited
            step.cancel()
        elif step is not None and not step.cancelled():
            step.exception()  # retrieved: not a "Task exception was never retrieved" in the log
        await upstream.aclose()
        f.switcher.release(m)
        _told(f, m, said)


async def told(f: FrontState, m: Model, stream: AsyncGenerator[bytes, None], said: Said) -> AsyncIterator[bytes]:
    """``stream``'s bytes, then what ``relay`` does at an answer's end (``_told``). ``stream`` is closed here, its
    client gone or not: left to the garbage collector, a relay whose client left gave its place in flight back only
    once collected, and its model, leaving, waited for it (a preempted stream waited 300 s for it in CI)."""
    try:
        async for chunk in stream:
            yield chunk
    except (GeneratorExit, asyncio.CancelledError):  # its client left
        said.outcome = "abandoned"
        raise
    finally:
        try:
            await stream.aclose()
        finally:
            _told(f, m, said)


def _told(f: FrontState, m: Model, said: Said) -> None:
    """An answer relayed: how it ended in the metrics (``ok``, ``abandoned``, ``cut``, ``broken``), its first byte's
    time and the model's pace, the request's line."""
    if said.code < 400:
        f.metrics.requests.labels(said.name, said.outcome).inc()
    if said.first:
        f.metrics.first_byte(said.name, said.first - said.arrived)
    m.relayed(said.first - said.arrived if said.first else None)
    logger.info(said.line())


async def disconnected(request: Request) -> None:
    """Returns when the client has gone (its body was read: what the server receives next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
