"""``hotweights switch``: one OpenAI-compatible port in front of an engine per model. Here the app is made and run:
its state (``handlers.FrontState``: the switcher that decides which engine is awake, ``switcher.py``), its routes
(``handlers.py``), its lifespan (the scheduler, the watch over the engines, the note for the next front should this
one die), its shutdown (open streams end with an error event within seconds) and what it leaves behind (the keeper
keeps the weights; old runs' log directories are cleaned). The engines listen on loopback ports of their own; their
``/sleep`` and ``/wake_up`` are never reachable through the front. With an API key (``--api-key``, the config's
``api_key``, else ``$VLLM_API_KEY``) every ``/v1`` and ``/switch`` path wants ``Authorization: Bearer KEY``, as
``vllm serve --api-key`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from ...observe import client_host
from ...openai_errors import http_error, server_error
from ...parked.records import take_port
from ...paths import daemon_paths
from ..config import ModelConfig, SwitchConfig
from ..running import ConfigSource, started_when_asked
from ..upstream.engines import Engine, EngineLike
from ..fit import say_fit
from .handlers import FrontState, routes
from ..gpus import gpu_memory
from ..kinds import KINDS
from ..upstream.leftovers import Note, retire_left
from ..metrics import SwitchMetrics
from .streams import Stopping
from ..switcher import Switcher, said_if_failed

logger = logging.getLogger("hotweights.switch")
SHUTDOWN_GRACE_S = 3  # uvicorn's wait for open connections on SIGINT/SIGTERM (its default: forever; ours was 30)


def create_app(config: SwitchConfig, log_dir: Path | None = None,
               engines: Callable[[ModelConfig], EngineLike] | None = None, note: Note | None = None,
               source: ConfigSource | None = None) -> Starlette:
    """The front's app; ``engines`` makes a model's engine (default: its real server process, ``Engine``); ``note``
    keeps a note of their processes for the next front, should this one die (``leftovers.py``); ``source``: where its
    configuration is read again, on SIGHUP, ``POST /switch/reload`` or (``source.watch``) a change of the file."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="hotweights-switch-"))
    metrics = SwitchMetrics()
    starts = min(config.start_jobs, len(config.models))  # so many standbys where starts go together
    switcher = Switcher(config, metrics, engines or (lambda m: Engine(m, log_dir, config.socket_dir, config.parking,
                                                                      starts, config.keep_kv, config.held_kv)),
                        {gpu: mem.total_mib for gpu, mem in gpu_memory().items()})
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
    stopping = Stopping()
    state = FrontState(config, switcher, metrics, client, stopping, log_dir, source)
    reloads: set[asyncio.Future[Any]] = set()

    def hangup() -> None:  # SIGHUP: read the configuration again (it used to end the front, with no last line)
        task = asyncio.ensure_future(state.reload("SIGHUP"))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncGenerator[None, None]:
        stopping.begin(switcher)
        with contextlib.suppress(RuntimeError):  # the main thread's loop only (an app in a test's thread has none)
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hangup)
        following = asyncio.create_task(follow(state)) if source is not None and source.watch else None
        keeper_before = await asyncio.to_thread(keeper_pid, config.socket_dir)  # 0: this front's preloads start it
        scheduling = asyncio.create_task(switcher.run())
        watching = asyncio.create_task(switcher.watch())
        for task, name in ((scheduling, "the scheduler"), (watching, "the watch over the engines")):
            task.set_name(name)  # a bug that ends one is said at once, not at the front's exit
            task.add_done_callback(said_if_failed)
        noting = asyncio.create_task(note.kept(lambda: {m.name: [m.engine.pid, m.engine.server]
                                                        for m in switcher.models.values()})) if note else None
        try:
            yield
        finally:
            if stopping.streams or stopping.waiting:
                logger.info("switch: stopping: %d stream(s) ended with an error event, %d waiting request(s) "
                            "answered 503", stopping.streams, stopping.waiting)
            tasks: list[asyncio.Future[Any]] = [t for t in (scheduling, watching, noting, following, *reloads) if t]
            for job in tasks:
                job.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
            await switcher.stop()
            if note:
                note.close()
            logger.info("switch: every engine stopped")
            await asyncio.to_thread(leave_behind, state.config, keeper_before)

    app = Starlette(lifespan=lifespan, exception_handlers={HTTPException: http_error, Exception: server_error},
                    routes=routes())
    app.state.front = state
    app.state.switcher, app.state.stopping = switcher, stopping
    return app


FOLLOW_S = 1.0  # --watch-config: the file's size and time looked at this often


async def follow(state: FrontState) -> None:
    """``--watch-config``: the configuration file read again once it has changed (its size or modification time) and
    stayed so for ``FOLLOW_S``, as llama-swap's ``--watch-config`` does."""
    assert state.source is not None
    path = state.source.path

    def seen() -> tuple[int, int]:
        try:
            st = path.stat()
            return st.st_size, st.st_mtime_ns
        except OSError:
            return -1, -1

    last = seen()
    while True:
        await asyncio.sleep(FOLLOW_S)
        now = seen()
        if now != last and now != (-1, -1):
            await asyncio.sleep(FOLLOW_S)  # an editor's save may come in parts
            if seen() == now:
                last = now
                await state.reload("the file changed")


def keeper_pid(socket_dir: str) -> int:
    """The pid of the keeper answering in ``socket_dir`` (the default when ""), 0 when none does."""
    from ...client import connect
    from ...errors import HotweightsError

    try:
        with connect(daemon_paths(socket_dir or None)) as client:
            return client.status().pid
    except (HotweightsError, OSError):
        return 0


def leave_behind(config: SwitchConfig, before: int) -> None:
    """On the way out, once the engines have stopped: their warm standbys retired (with ``keep_standbys``, left for
    the next front), and the keeper kept for the next start (with ``stop_keeper``, a keeper this front's preloads
    started is stopped, its entries freed). The last line names everything this front leaves running."""
    from ...client import connect

    directory = daemon_paths(config.socket_dir or None).directory
    left = []
    for kind in {KINDS[m.engine].name: KINDS[m.engine] for m in config.models}.values():
        if config.keep_standbys:
            if pids := kind.standbys(directory):
                left.append(f"{len(pids)} warm standby(s) of {kind.name} (pid {', '.join(map(str, pids))}) for "
                            f"the next front's starts: `hotweights standby --stop` retires them")
        elif pids := kind.retire_standbys(directory):
            logger.info("switch: retired %d warm standby(s) of %s (pid %s); --keep-standbys leaves them for the "
                        "next front", len(pids), kind.name, ", ".join(map(str, pids)))
    pid = keeper_pid(config.socket_dir)
    if pid and config.stop_keeper and pid != before:
        with connect(daemon_paths(config.socket_dir or None)) as client:
            client.stop()
        logger.info("switch: stopped the keeper this front started (pid %d): its weights are freed", pid)
    elif pid:
        ran = ", which ran before this front" if pid == before else ""
        left.insert(0, f"the keeper (pid {pid}{ran}) keeps the weights, so that the next front starts at once; "
                       f"`hotweights stop` frees them" + ("" if ran else " (or run the front with --stop-keeper)"))
    if left:
        logger.info("switch: left running: %s", "; ".join(left))
    else:
        logger.info("switch: left nothing running")


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


def run(config: SwitchConfig, log_dir: Path | None = None, source: ConfigSource | None = None) -> int:
    """Serve until SIGINT/SIGTERM; every engine started is stopped on the way out; SIGHUP reads ``source`` again."""
    import uvicorn

    sock = take_port(config.host, config.port, config.socket_dir or None)  # before any engine starts
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per relayed request otherwise
    log_dir = log_dir or new_log_dir()
    config = config.with_auto_jobs()  # auto: by the GPUs there are
    config, asked = started_when_asked(config)
    if asked:
        logger.info("switch: %s start on their first request (start = \"cached\"): their engines cannot park "
                    "(%s), so start-up would start them only to stop them", ", ".join(asked),
                    "parking is off" if not config.parking else "no sleep mode")
    daemon_dir = daemon_paths(config.socket_dir or None).directory
    retire_left(daemon_dir)  # what a dead front left running, before this one starts its own
    url = f"http://{client_host(config.host)}:{config.port}"
    app = create_app(config, log_dir, note=Note(daemon_dir, url), source=source)
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
