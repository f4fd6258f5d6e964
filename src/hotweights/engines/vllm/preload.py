"""``hotweights preload --engine vllm``: fill engine-layout entries with vLLM's own loader.

Runs stock vLLM (``python -m vllm.entrypoints.openai.api_server``) with
``--load-format hotweights`` and ``{"publish": true, "layout": "engine"}``: every worker
(one per TP rank) loads the checkpoint with vLLM's ``DefaultModelLoader``, post-processes
it and publishes its tensors. The daemon says when every rank is done: a new engine-layout row of
this model for each rank (``tp`` = ``rank/size``), or an existing one that its attach count shows
vLLM mapped; vLLM's log is read only to say why it failed. Then vLLM is left to finish its start-up,
so that what it compiles lands in its compile cache (the cache's key does not hold the load format:
the next ``--load-format hotweights`` start with the same flags loads it instead of compiling), then
it is stopped. The daemon is started
detached beforehand, because vLLM kills its whole process tree on exit. Once the weights are in, a warm
standby of the Python that runs vLLM is prepared (``standby/handoff.prepare``, as a start leaves one; not
with ``HOTWEIGHTS_VLLM_STANDBY=off``): it imports vLLM while this vLLM compiles and captures its graphs, so
that the first ``hotweights vllm serve`` after the preload is a standby start that does not wait for it
(prepared after vLLM stopped, it made that start wait 24 s for its imports on an H200).

Its KV cache is the least vLLM starts with (``kvpin.py``: one ``--max-model-len`` sequence, given as
``--kv-cache-memory-bytes``), not profiled: preloads of several models run beside each other (``hotweights switch``),
and vLLM's profile counts what the others allocate as its own. Where vLLM refuses that size for its KV cache, the
preload runs once more without it. Its log is ``vllm-preload-<model dir>.log`` beside the daemon's (the run
before's as ``.log.1``).

Which Python runs vLLM: ``--vllm-python``, else ``$HOTWEIGHTS_VLLM_PYTHON``, else this one.
The worker's log is kept (``--log``) and its tail shown on failure.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ...client import connect, ensure_daemon
from ...errors import HotweightsError
from ...evidence import GIB, WRITE_THROUGH_FAILED
from ...observe import Observed, free_port
from ...paths import DaemonPaths, daemon_paths, rotate_log
from ...rows import EntryRow
from .kvpin import kv_pin
from .options import engine_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VllmPreloadResult:
    published: list[dict]  # one per rank that published: tensors, gib, key, device
    already_cached: int  # ranks that found their entry
    seconds: float
    log: str
    started_up: bool  # vLLM finished its start-up (and saved its compile cache) before it was stopped
    standby: str  # "prepared", "ready" (one was there already), or why none was: "off", "failed" (logged)


def preload_vllm(model: str, *, dtype: str = "auto", tp_size: int = 1, socket_dir: str | None = None,
                 python: str | None = None, extra_args: list[str] | None = None, timeout_s: float = 1800.0,
                 log_path: Path | None = None) -> VllmPreloadResult:
    if not Path(model, "config.json").is_file():
        raise HotweightsError(f"{model} is not a model directory with a config.json (local directories only)")
    paths = daemon_paths(socket_dir)
    with ensure_daemon(paths):
        pass
    python = python or os.environ.get("HOTWEIGHTS_VLLM_PYTHON") or sys.executable
    if tp_size == 1 and os.environ.get(SERVER_PRELOAD_ENV, "") != "1":
        try:
            return _publish_only(model, dtype, paths, python, extra_args or [], timeout_s, log_path)
        except HotweightsError as exc:  # a vLLM or a model this path does not serve: the whole start still does
            logger.warning("%s; preloading with a whole vLLM start instead", exc)
    pin = kv_pin(model, extra_args or [], tp_size)
    try:
        return _preload(model, dtype, tp_size, paths, python, [*(extra_args or []), *(
            ["--kv-cache-memory-bytes", str(pin)] if pin else [])], timeout_s, log_path)
    except VllmExited as exc:
        if not pin or "kv cache" not in str(exc).lower():  # vLLM's words for a KV cache too small for a sequence
            raise
        logger.warning("vLLM did not start with a KV cache of %d MiB (%s); preloading again with the KV cache vLLM "
                       "sizes itself", pin >> 20, exc)
    return _preload(model, dtype, tp_size, paths, python, extra_args or [], timeout_s, log_path)


SERVER_PRELOAD_ENV = "HOTWEIGHTS_VLLM_SERVER_PRELOAD"  # 1: always the whole vLLM start (its compile cache filled)
STATUS_TIMEOUT_S = 15.0  # the keeper's rows after the publishes: a loaded machine's keeper answers in seconds


def _publish_only(model: str, dtype: str, paths: DaemonPaths, python: str, extra_args: list[str], timeout_s: float,
                  log_path: Path | None) -> VllmPreloadResult:
    """vLLM's loader run in one process without a vLLM start (``publish.py``); raises HotweightsError where it
    published nothing."""
    log_dir, label = _log_place(model, paths, log_path)
    log = log_dir / f"{label}.log"
    rotate_log(log, keep_bytes=0)  # the run before's as .log.1, as the whole start's
    extra = {"publish": True, "layout": "engine", "socket_dir": str(paths.directory)}
    # from a warm standby where one fits (``launcher.run_module``): vLLM imported already
    cmd = [python, "-m", "hotweights.engines.vllm.launcher", "--socket-dir", str(paths.directory),
           "hotweights.engines.vllm.publish", "--model", model, "--dtype", dtype,
           "--load-format", "hotweights", "--model-loader-extra-config", json.dumps(extra), *extra_args]
    start = time.monotonic()
    ranks = Ranks.before(paths, model, 1)
    with open(log, "w") as out:
        try:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            raise HotweightsError(f"vLLM's loader did not publish within {timeout_s:.0f} s; see {log}") from None
    published, mapped = ranks.now()
    text = log.read_text(errors="replace")
    if failure := _write_through_failure(text):
        raise HotweightsError(f"vLLM loaded the model but did not publish it: {failure}; log: {log}")
    if done.returncode != 0 or not (published or mapped):
        raise HotweightsError(f"vLLM's loader without a vLLM start failed (exit {done.returncode}): "
                              f"{_cause(text)}; log: {log}")
    standby = _leave_standby(paths.directory, python)
    return VllmPreloadResult(_published(published), 0 if published else 1, time.monotonic() - start, str(log), False,
                             standby)


def _write_through_failure(text: str) -> str | None:
    """The line of a vLLM log that says its write-through failed, if one does."""
    return next((line.strip() for line in text.splitlines() if any(f in line for f in WRITE_THROUGH_FAILED)), None)


def _cause(text: str) -> str:
    """The first exception a vLLM log names (its warnings and vLLM's own wrapper error aside)."""
    causes = [m.group(1) for line in text.splitlines() if "WARNING" not in line
              and (m := re.search(r"\b(\w+(?:Error|Exception): .*)", line))
              and "Engine core initialization" not in line]
    return causes[0] if causes else "see the log"


def _published(rows: list[EntryRow]) -> list[dict]:
    """The result's rows: one per rank that published, in rank order."""
    return [{"num_tensors": r.num_tensors, "gib": r.tensor_nbytes / GIB, "model": r.model, "key": r.key,
             "device": r.device} for r in sorted(rows, key=lambda r: r.rank)]


def _log_place(model: str, paths: DaemonPaths, log_path: Path | None) -> tuple[Path, str]:
    """Where a preload's log goes: beside the daemon's as ``vllm-preload-<model dir>.log``, unless named."""
    return (log_path.parent, log_path.stem) if log_path else (paths.directory, f"vllm-preload-{Path(model).name}")


class VllmExited(HotweightsError):
    """vLLM exited before it published."""


def _preload(model: str, dtype: str, tp_size: int, paths: DaemonPaths, python: str, extra_args: list[str],
             timeout_s: float, log_path: Path | None) -> VllmPreloadResult:
    port = free_port()
    extra = {"publish": True, "layout": "engine", "socket_dir": str(paths.directory)}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", dtype,
           "--tensor-parallel-size", str(tp_size), "--load-format", "hotweights",
           "--model-loader-extra-config", json.dumps(extra), "--host", "127.0.0.1", "--port", str(port),
           *extra_args]
    # its log beside the daemon's (this model's last preload: preloads of other models may run beside it; no
    # temporary directory left behind), unless named
    log_dir, label = _log_place(model, paths, log_path)
    rotate_log(log_dir / f"{label}.log", keep_bytes=0)  # the last run's log stays, as LABEL.log.1: a preload tried
    # again (alone, after it failed beside others) keeps the first failure's reason
    start = time.monotonic()
    ranks = Ranks.before(paths, model, tp_size)
    obs = Observed(label, cmd, out_dir=log_dir, health_url=f"http://127.0.0.1:{port}/health")
    said = 0
    try:
        while True:
            published, mapped = ranks.now()
            if ranks.all_done(published, mapped):
                break
            text = obs.log_text()
            if failure := _write_through_failure(text):
                raise HotweightsError(f"vLLM loaded the model but did not publish it: {failure}\n"
                                      f"log: {obs.log_path}")
            if obs.proc.poll() is not None:
                raise VllmExited(f"vLLM exited with code {obs.proc.returncode} before publishing: "
                                 f"{_cause(text)}\nlog: {obs.log_path}")
            if time.monotonic() - start > timeout_s:
                raise HotweightsError(f"vLLM did not publish within {timeout_s:.0f} s; see {obs.log_path}")
            if int(time.monotonic() - start) // 10 > said:  # a line every 10 s: vLLM's start-up is long
                said = int(time.monotonic() - start) // 10
                print(f"preload --engine vllm: vLLM is starting and loading the model ({said * 10} s; "
                      f"log {obs.log_path})", file=sys.stderr, flush=True)
            time.sleep(0.5)
        standby = _leave_standby(paths.directory, python)  # its imports overlap vLLM's compile and graphs
        started_up = obs.wait_ready(timeout_s=timeout_s).ready  # the compile cache is written on the way
    finally:
        obs.stop(grace_s=20)
    cached = len({r.rank for r in mapped} - {r.rank for r in published})
    return VllmPreloadResult(_published(published), cached, time.monotonic() - start, str(obs.log_path), started_up,
                             standby)


def _leave_standby(directory: Path, python: str) -> str:
    """A standby for the first start after this preload, in the Python that runs vLLM (it imports beside vLLM's
    compile, which outlasts it: 24 s against 60 s on an H200 for an 8B)."""
    from ...standby import handoff
    from .standby import SPEC

    if not handoff.enabled(dict(os.environ)):
        return handoff.Prepared.OFF
    try:
        return handoff.prepare(SPEC, directory, dict(os.environ), python=python, settle_s=handoff.SETTLE_S)
    except FileNotFoundError as exc:
        logger.warning("no warm standby left for the next start: %s", exc)
        return handoff.Prepared.FAILED


@dataclass(frozen=True)
class Ranks:
    """What a preload's ranks did in the keeper, the one account both preloads read (the loader alone's once it
    exits, the whole start's while it runs): an engine-layout entry of ``model`` that was not there ``before`` is
    one a rank published; one that was, whose attach count grew, is one a rank found cached and mapped."""

    paths: DaemonPaths
    model: str
    tp_size: int
    attaches: dict[str, int]  # each entry's attach count before the preload, by key

    @classmethod
    def before(cls, paths: DaemonPaths, model: str, tp_size: int) -> Ranks:
        rows = _engine_rows(paths, Path(model).name, tp_size)
        return cls(paths, Path(model).name, tp_size, {row.key: row.num_attaches for row in rows})

    def now(self) -> tuple[list[EntryRow], list[EntryRow]]:
        """The entries published since, and those mapped since."""
        rows = _engine_rows(self.paths, self.model, self.tp_size)
        published = [r for r in rows if r.key not in self.attaches]
        mapped = [r for r in rows if r.key in self.attaches and r.num_attaches > self.attaches[r.key]]
        return published, mapped

    def all_done(self, published: list[EntryRow], mapped: list[EntryRow]) -> bool:
        """Whether every rank has published its entry or mapped one."""
        return {r.rank[0] for r in published + mapped} >= set(range(self.tp_size))


def _engine_rows(paths: DaemonPaths, model: str, tp_size: int) -> list[EntryRow]:
    """The daemon's engine-layout rows of ``model`` for a ``tp_size``-way start (one per rank when done). Read
    patiently: right after the ranks' publishes, a loaded machine's keeper may take seconds to answer (on a busy CI
    machine, a TP=2 preload's read timed out at the 2 s default)."""
    with connect(paths, timeout_s=STATUS_TIMEOUT_S) as client:
        return engine_rows(client.status().rows(), model, tp_size)
