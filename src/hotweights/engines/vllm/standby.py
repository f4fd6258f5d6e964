"""A warm standby for ``hotweights vllm serve``: this interpreter with vLLM imported, no CUDA, waiting.

Runs as its own process (``python -m hotweights.engines.vllm.standby --socket-dir D``), started
detached by the launcher (``handoff.prepare``) so that the next start finds one. It takes the
lock ``vllm-standby-<tag>.lock`` (one standby per interpreter and socket directory), imports
vLLM's API server, CLI, engine core and worker modules and loads vLLM's plugins (this one's
included), then answers on its socket: the peer's uid must be its own.

One start per standby: on ``start`` it forks the server, gives up its socket and lock (the
launcher prepares the next standby), tells the launcher the server's pid, and stays as the
server's supervisor: it reports the exit code, and ends the server's process group when the
launcher goes away (a killed launcher leaves no GPU-holding server behind). The server dies
with it too (``PR_SET_PDEATHSIG``).

Fork safety, checked before every fork and reported in ``ready``: no CUDA context (torch's
``is_initialized``; vLLM's API server never makes one); one Python thread (so no Python lock, the
import lock or a logging handler's, is held by a thread the child does not get; the accept loop is
single-threaded by design); no event loop. Native threads may exist: the BLAS pool numpy's
OpenBLAS starts at import (one per core but one), idle on a futex; OpenBLAS shuts it down around
``fork`` (``pthread_atfork``) and the child starts its own. vLLM's own API server forks its engine
core beside the same pool when ``fork`` is chosen. The child sets the launcher's environment,
working directory and stdio before vLLM's code runs, as ``python -m MODULE ARGS`` would. What
vLLM read at import time is what the fingerprint pins: the variables that matter must be equal.

The engine core: the launcher asks for ``VLLM_WORKER_MULTIPROC_METHOD=fork`` (see
``launcher``), so vLLM forks its EngineCore (and TP workers) from this already-imported process
instead of starting fresh interpreters that import vLLM again. vLLM itself falls back to spawn
when CUDA is initialized in the parent; its CPU platform always spawns.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import fcntl
import importlib
import logging
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from ...paths import ensure_socket_dir
from ...wire import close_fds
from .handoff import fingerprint, peer_uid, receive, send, standby_paths

logger = logging.getLogger("hotweights.standby")

# what vLLM's API server imports anyway, and no more: a fork from it is vLLM's own tested path. The
# engine core's worker modules (the GPU worker, model runner, sampler) stay out: imported before the
# fork, a Triton kernel of vLLM 0.26's sampler failed in the forked engine core on an H200 ("Pointer
# argument cannot be accessed from Triton"), while the same start with them imported after the fork ran
PREIMPORTS = ("torch", "transformers", "vllm", "vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve",
              "vllm.entrypoints.openai.api_server", "vllm.v1.engine.async_llm", "hotweights.engines.vllm.loader")
GRACE_S = 30.0  # from SIGTERM to SIGKILL when the launcher is gone
AFTER_MAX_S = 600.0  # the longest the standby waits for the start it follows before it imports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotweights.engines.vllm.standby")
    parser.add_argument("--socket-dir", required=True)
    parser.add_argument("--after-pid", type=int, default=0, help="import only once this start is ready or gone")
    parser.add_argument("--after-url", default="", help="that start's health URL")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    directory = Path(args.socket_dir)
    ensure_socket_dir(directory)
    paths = standby_paths(directory)
    lock = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        logger.info("another standby holds %s; exiting", paths.lock)
        return 0
    os.ftruncate(lock, 0)
    os.write(lock, str(os.getpid()).encode())  # who to stop while the socket is not up yet
    if args.after_pid:
        logger.info("waiting for the start in progress (pid %d) to be ready: %s", args.after_pid,
                    _wait_for(args.after_pid, args.after_url))
    stamp = fingerprint()  # before the imports: what they were made from
    start = time.perf_counter()
    missing = _preimport()
    imports_s = time.perf_counter() - start
    state = {"pid": os.getpid(), "fingerprint": stamp, "imports_s": round(imports_s, 2), "missing": missing}
    with contextlib.suppress(FileNotFoundError):
        paths.socket.unlink()  # a stale one: only the lock holder removes it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    listener.bind(str(paths.socket))
    os.chmod(paths.socket, 0o600)
    listener.listen(8)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    logger.info("vLLM standby READY: socket=%s pid=%d imports=%.1fs (not in this build: %s)", paths.socket,
                os.getpid(), imports_s, ", ".join(missing) or "none")
    listener.settimeout(30.0)
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if not paths.socket.exists():
                    logger.info("%s was removed; exiting", paths.socket)
                    return 0
                continue
            conn.settimeout(None)
            with conn:
                server = _serve(conn, state, listener, lock, paths.socket)
                if server is not None:
                    return _supervise(conn, server)
                if state.get("stopping"):
                    return 0
    finally:
        if not state.get("handed_over"):
            with contextlib.suppress(FileNotFoundError):
                paths.socket.unlink()


def _wait_for(pid: int, url: str) -> str:
    """Until the start of ``pid`` answers ``url`` with 200, or exits, or ``AFTER_MAX_S`` pass; what happened."""
    import urllib.request

    deadline = time.monotonic() + AFTER_MAX_S
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return "it exited"
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return "ready"
        time.sleep(0.5)
    return f"not ready after {AFTER_MAX_S:.0f} s; importing anyway"


def _preimport() -> list[str]:
    missing = []
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    try:  # vLLM loads its plugins once per process: the server (our child) finds them loaded
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    except ImportError:
        missing.append("vllm.plugins")
    return missing


def _fork_safety() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    return {"cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
            "threads": threading.active_count(), "native_threads": len(os.listdir("/proc/self/task"))}


def _serve(conn: socket.socket, state: dict[str, Any], listener: socket.socket, lock: int,
           sock_path: Path) -> int | None:
    """Answer one connection; the server's pid once a start was handed over."""
    pid, uid = peer_uid(conn)
    if uid != os.getuid():
        logger.warning("connection rejected: peer_pid=%d peer_uid=%d reason=uid-mismatch", pid, uid)
        return None
    conn.settimeout(10.0)
    try:
        while True:
            msg, fds = receive(conn, "hello", "start", "stop")
            if msg["op"] == "hello":
                send(conn, "ready", **state, **_fork_safety())
            elif msg["op"] == "stop":
                logger.info("stop requested by pid %d", pid)
                _retire(listener, lock, sock_path, state)  # before the reply ends: the launcher prepares the next
                state["stopping"] = True
                return None
            else:
                safety = _fork_safety()
                if safety["cuda_initialized"] or safety["threads"] != 1 or len(fds) != 3:
                    close_fds(fds)
                    logger.error("start refused: %s, %d fds", safety, len(fds))
                    return None
                # the next start goes to the next standby: the lock is free before the fork, so that the
                # child never holds it (the launcher prepares the next standby as soon as it hears "started")
                _retire(listener, lock, sock_path, state)
                server = _fork_server(msg, fds, conn)
                send(conn, "started", pid=server)
                logger.info("started vLLM for pid %d: server pid %d, %s %s", pid, server, msg["module"],
                            " ".join(msg["args"]))
                return server
    except (EOFError, OSError, ValueError, KeyError, TypeError) as exc:
        logger.info("connection from pid %d ended: %s", pid, exc)
        return None


def _retire(listener: socket.socket, lock: int, sock_path: Path, state: dict[str, Any]) -> None:
    with contextlib.suppress(FileNotFoundError):
        sock_path.unlink()  # while holding the lock: only the lock holder removes the socket
    listener.close()
    os.close(lock)
    state["handed_over"] = True


def _fork_server(msg: dict[str, Any], fds: list[int], conn: socket.socket) -> int:
    module, args, env, cwd = str(msg["module"]), [str(a) for a in msg["args"]], dict(msg["env"]), str(msg["cwd"])
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        close_fds(fds)
        return pid
    code: Any = 1
    try:
        os.setpgid(0, 0)  # the launcher signals the group, as a terminal would
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: die with the supervisor
        if os.getppid() != parent:
            os._exit(1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        close_fds(fds)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = cwd  # what ``python -m`` puts first
        sys.argv = [module, *args]
        logging.getLogger().handlers.clear()  # the standby's own log handler wrote to its log file
        code = 0
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001  (the server's own failure: shown as python would show it)
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code or 0)


def _supervise(conn: socket.socket, server: int) -> int:
    """Until the server exits: end its process group if the launcher goes away; then report its code."""
    pidfd = os.pidfd_open(server)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(conn, select.POLLIN | select.POLLHUP)
    launcher_gone = False
    deadline = None
    while True:
        for fd, _ in poller.poll(1000 if deadline else None):
            if fd == pidfd:
                _, status = os.waitpid(server, 0)
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
                logger.info("server pid %d exited: code=%d", server, code)
                if not launcher_gone:
                    with contextlib.suppress(OSError):
                        send(conn, "exited", code=code)
                return 0
            if not launcher_gone and not conn.recv(4096):
                launcher_gone = True
                poller.unregister(conn)
                logger.warning("the launcher went away: stopping server pid %d", server)
                _signal_group(server, signal.SIGTERM)
                deadline = time.monotonic() + GRACE_S
        if deadline and time.monotonic() > deadline:
            _signal_group(server, signal.SIGKILL)
            deadline = None


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


if __name__ == "__main__":
    sys.exit(main())
