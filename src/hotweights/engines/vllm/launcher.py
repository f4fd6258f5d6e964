"""``hotweights vllm ARGS...``: the vLLM this interpreter can run, from a warm standby where one fits.

Runs in the hotweights CLI process, before vLLM is imported: the strict check
(``preflight.check``) comes first. For ``serve``, ``run`` then hands the start to the warm
standby of this interpreter (``standby.handoff.hand_over``; the standby has vLLM imported already), stays
in the foreground relaying SIGINT, SIGTERM and SIGHUP, and exits with the server's code, as
``vllm serve`` would; when no standby fits, it says why in one line and becomes vLLM (exec). Either
way it prepares a standby for the next start, which imports vLLM once this start is ready.
``HOTWEIGHTS_VLLM_STANDBY=off`` turns both off.

``--park-on-exit [1|2]`` (and ``--park-idle-s S``), hotweights' flags, taken out of the argv before vLLM
sees it: the server runs with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` (its ``/sleep`` and
``/wake_up``: bind it to a loopback ``--host``), as a child of this launcher in its own session, not from
the standby; Ctrl-C parks it and the next run of the same start wakes it (``parked/records.py``). vLLM's
CPU build has no sleep mode: refused there, in one line.

The engine core: vLLM's CLI sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unless it is set, so its
EngineCore (and each TP worker) starts as a fresh interpreter that imports vLLM again. The launcher
sets ``fork`` unless the user chose: fork is vLLM's own default as a library, vLLM switches to
spawn by itself when the parent has initialized CUDA (``_maybe_force_spawn``), the API server
never does, and vLLM's CPU platform spawns regardless.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ... import evidence
from ...argv import Option
from ...standby import handoff
from .standby import SPEC
from .start import VllmStart

logger = logging.getLogger(__name__)


def run(start: VllmStart, *, park: int = 0, park_idle_s: float = 3600.0) -> int:
    """Start vLLM as ``start`` says (``serve MODEL ...``): from the standby, else by exec; the exit code.
    ``park``: the level a Ctrl-C parks it at (``--park-on-exit``), 0 for a plain start."""
    module, args = start.command()
    cmd = [sys.executable, "-m", module, *args]
    environ = dict(os.environ)
    env = {**environ, "VLLM_WORKER_MULTIPROC_METHOD": environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork")}
    if park:
        return _run_parked(start, cmd, env, park, park_idle_s)
    if start.is_serve and handoff.enabled(environ):
        directory = start.socket_dir
        at_once = handoff.imports_at_once(environ)  # else the next standby imports once this start is ready
        server = _handed_over(directory, module, explicit_log_error_stack(args, env), env)
        if server is not None:
            handoff.prepare(SPEC, directory, environ, after=None if at_once else (server.pid, start.health_url))
            return server.wait()
        handoff.prepare(SPEC, directory, environ,  # this pid becomes vLLM
                        after=None if at_once else (os.getpid(), start.health_url))
    return _exec(cmd, env)


def _handed_over(directory: Path, module: str, args: list[str], env: dict[str, str],
                 retire_stale: bool = True) -> handoff.Server | None:
    """The server a standby started for ``python -m MODULE ARGS`` (``handoff.hand_over``), or None where none could;
    the standby's line either way."""
    try:
        server = handoff.hand_over(SPEC, directory, module, args, env, retire_stale=retire_stale)
    except handoff.StandbyUnusable as exc:
        logger.info(evidence.standby_unused(str(exc)))
        return None
    logger.info(evidence.standby_used(server.pid, server.imports_s))
    return server


def _exec(cmd: list[str], env: dict[str, str]) -> int:
    """This process becomes ``cmd`` (its output flushed first)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 1  # not reached


def run_module(directory: Path, module: str, args: list[str]) -> int:
    """``python -m MODULE ARGS`` in a warm standby of this interpreter where one fits (vLLM imported already), else in
    this process (exec); its exit code. The preload's loader runs so (``preload._publish_only``): each loader-alone
    preload of an 8B imported vLLM itself (23-29 s a preload on an H200, beside the starts), though a standby waited
    with vLLM imported. The standby taken, the next one is prepared at once, for the starts; where there was none, one
    is prepared at once too, beside this run: on an H200 the first one came only as the first preload ended, and the
    start that follows the default model's preload waited 20.8 s for it to import (2026-12-05). Where several are kept
    (``HOTWEIGHTS_STANDBYS``; ``hotweights switch`` keeps one more than its starts take), it fills up to two free
    places, so that the start after this preload finds one though this run took one: with one, the starts after
    the preloads of three 8B each waited 17-25 s for the standby this run had prepared (H200, 2026-12-05)."""
    environ = dict(os.environ)
    if handoff.enabled(environ):
        server = _handed_over(directory, module, args, environ, retire_stale=False)
        count = min(2, handoff.places(environ))
        for k in range(count):  # one settles in its place before the next looks for a free one
            settle_s = handoff.SETTLE_S if k + 1 < count else 0.0
            if handoff.prepare(SPEC, directory, environ, settle_s=settle_s) is not handoff.Prepared.PREPARED:
                break
        if server is not None:
            return server.wait()
    return _exec([sys.executable, "-m", module, *args], environ)


def main(argv: list[str]) -> int:
    """``python -m hotweights.engines.vllm.launcher --socket-dir D MODULE ARGS...``: ``run_module``."""
    if len(argv) < 3 or argv[0] != "--socket-dir":
        print("usage: python -m hotweights.engines.vllm.launcher --socket-dir D MODULE [ARGS...]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_module(Path(argv[1]), argv[2], argv[3:])


def explicit_log_error_stack(args: list[str], env: dict[str, str]) -> list[str]:
    """``args`` with vLLM's ``--log-error-stack`` made explicit: its default is ``VLLM_SERVER_DEV_MODE`` read
    when vLLM is imported, which for a standby start was the standby's environment, not this start's
    (``standby.SPEC.env_after_fork``). A choice the user made stays, also one a ``--config`` file may hold."""
    if Option(("--log-error-stack", "--no-log-error-stack", "--config"), "none").present(args):
        return args
    try:
        dev_mode = int(env.get("VLLM_SERVER_DEV_MODE", "0") or "0") != 0  # as vLLM reads it
    except ValueError:
        dev_mode = False
    return [*args, "--log-error-stack" if dev_mode else "--no-log-error-stack"]


def _run_parked(start: VllmStart, cmd: list[str], env: dict[str, str], level: int, idle_s: float) -> int:
    from ...parked import front
    from ...parked import records as parked
    from .start import is_cpu_build

    if level not in (1, 2):
        raise ValueError(f"--park-on-exit takes level 1 (weights kept mapped) or 2 (unmapped), got {level}")
    if not start.is_serve:
        raise ValueError("--park-on-exit parks a server: hotweights vllm serve MODEL ... --park-on-exit")
    if is_cpu_build():
        raise ValueError("--park-on-exit needs vLLM's sleep mode, which its CPU build does not have: start "
                         "without it (a restart still maps the cached weights and uses the standby)")
    if not Option(("--enable-sleep-mode",), "none").present(cmd):
        cmd = [*cmd, "--enable-sleep-mode"]
    url = start.health_url.removesuffix("/health")
    fingerprint = parked.start_fingerprint("vllm", {"argv": list(start.argv)}, SPEC.packages, SPEC.env_prefixes)
    return front.run_front(start.socket_dir, "vllm", fingerprint, url, cmd, {**env, "VLLM_SERVER_DEV_MODE": "1"},
                            level, idle_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
