"""The engines behind ``hotweights switch``: one server process per model, on a loopback port of its own.

``hotweights``: ``hotweights serve MODEL`` (parks: ``/sleep``, ``/wake_up``, served on loopback only);
``vllm``: ``hotweights vllm serve MODEL`` (from the warm standby) with ``--enable-sleep-mode`` and
``VLLM_SERVER_DEV_MODE=1`` where vLLM has a sleep mode (its GPU build). vLLM's CPU build has none: there a
park stops the engine and a wake starts it again (from the standby), and ``status`` says so
(``parks: false``). Blocking calls; the front runs them on worker threads. Torch-free.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..engines.vllm.options import LOAD_FORMAT
from ..engines.vllm.start import VllmStart, is_cpu_build
from ..errors import HotweightsError
from ..evidence import standby_server
from ..protocol import EntryRow
from ..observe import free_port, post
from ..standby.handoff import serving_pids
from .config import ModelConfig

logger = logging.getLogger("hotweights.switch")

AWAKE, PARKED, DEEP, STARTING, FAILED, STOPPED = "awake", "parked", "deep-parked", "starting", "failed", "stopped"


def gpu_mib_by_pid() -> dict[int, int]:
    """GPU memory per process (``nvidia-smi``), {} where there is none."""
    import shutil

    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return {int(p): int(m) for p, m in (x.split(",") for x in out.splitlines() if x.strip())}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


class EngineError(RuntimeError):
    """An engine that would not start, park or wake; the message says why (its log's last lines)."""


class Engine:
    """One model's server process."""

    def __init__(self, model: ModelConfig, log_dir: Path, socket_dir: str = "", parking: bool = True) -> None:
        self.model, self.socket_dir = model, socket_dir
        self.log_path = log_dir / f"{model.name.replace('/', '_')}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.server = 0  # the server a warm standby forked for this start (the standby's child), if any
        self.parks = parking and (model.engine == "hotweights" or not is_cpu_build())
        self.level = 0  # parked at

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def pids(self) -> list[int]:
        """The processes of this start: with vLLM from a warm standby, the server is the standby's child."""
        return serving_pids(self.pid, self.server) if self.pid else []

    def command(self) -> tuple[list[str], dict[str, str]]:
        m = self.model
        env = self.env()
        common = [str(m.checkpoint), "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", m.name]
        if m.engine == "hotweights":
            return [sys.executable, "-m", "hotweights", "serve", *common, *m.args], env
        cmd = [sys.executable, "-m", "hotweights", "vllm", "serve", *common, *m.args]
        if VllmStart.parse(list(m.args)).load_format is None:  # the engine layout the preload made, zero-copy
            cmd += ["--load-format", "hotweights"]
        return cmd + self.sleep_mode(), {**env, "VLLM_SERVER_DEV_MODE": "1"} if self.parks else env

    def sleep_mode(self) -> list[str]:
        """vLLM's flag for a start that parks, given to its preload too: it is in vLLM's compile-cache key, so a
        preload without it left the first start of each parking engine compiling again (23-31 s on an H200)."""
        return ["--enable-sleep-mode"] if self.parks and "--enable-sleep-mode" not in self.model.args else []

    def env(self) -> dict[str, str]:
        """Its preload's, engine's and host copies' environment: the front's, with the model's GPUs."""
        env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}  # the front checks keys, not engines
        if self.model.gpus:  # the cache keys name GPUs by UUID: any order of them finds its entries
            env["CUDA_VISIBLE_DEVICES"] = self.model.cuda_visible_devices()
        return {**env, "HOTWEIGHTS_SOCKET_DIR": self.socket_dir} if self.socket_dir else env

    def preload(self, timeout_s: float = 1800.0) -> str:
        """The model's weights into the keeper (``hotweights preload`` starts a daemon when none runs; the
        engine layout for vLLM), once: what happened, in a few words."""
        m = self.model
        chosen = VllmStart.parse(list(m.args)).load_format or LOAD_FORMAT
        if m.engine == "vllm" and chosen != LOAD_FORMAT:
            return f"not preloaded (--load-format {chosen}: vLLM reads the checkpoint itself)"
        if m.engine == "vllm" and self.layout_cached():
            return "cached already"
        try:
            done = subprocess.run([sys.executable, "-m", "hotweights", *self.preload_command()], capture_output=True,
                                  text=True, env=self.env(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"not cached (the preload took over {timeout_s:.0f} s)"
        if done.returncode == 0:
            return "cached"
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"not cached ({last[-200:]})"

    def preload_command(self) -> list[str]:
        """``hotweights preload`` for this model: for vLLM with the engine's own flags (those of the load format
        aside), so that what the preload's vLLM compiles is what the engine's first start finds cached. The
        tensor parallelism is the preload's own flag: it waits for an entry of every rank."""
        m, args = self.model, list(self.model.args)
        if m.engine == "hotweights":
            picked = [x for i, a in enumerate(args) if a in ("--device", "--dtype") and i + 1 < len(args)
                      for x in (a, args[i + 1])]
            return ["preload", "--model", str(m.checkpoint), *picked]
        own, skip = [], False
        for a in args:  # FLAG VALUE or FLAG=VALUE
            name, eq, _ = a.partition("=")
            if skip or name in ("--load-format", "--model-loader-extra-config", "--tensor-parallel-size", "-tp"):
                skip = not skip and not eq
                continue
            own.append(a)
        tp = VllmStart.parse(args).tensor_parallel_size
        return ["preload", "--engine", "vllm", "--model", str(m.checkpoint), "--tensor-parallel-size", str(tp),
                *[f"--vllm-arg={a}" for a in own + self.sleep_mode()]]

    def _rows(self) -> list[EntryRow]:
        """The keeper's entries (OSError or HotweightsError when none answers)."""
        from ..client import connect
        from ..paths import daemon_paths

        with connect(daemon_paths(self.socket_dir or None)) as client:
            return client.status().rows()

    def _own(self, rows: list[EntryRow]) -> list[EntryRow]:
        """The entries of this model's checkpoint (by its directory's name; vLLM's engine layout for vLLM)."""
        return [r for r in rows if r.model == self.model.checkpoint.name
                and (self.model.engine != "vllm" or r.layout.startswith("vllm/"))]

    def layout_cached(self) -> bool:
        """Whether the keeper holds this model's engine-layout entry of every rank (its device copy) already: a
        front started again skips the preload, a whole vLLM start per model (the start's attach checks the key)."""
        tp = VllmStart.parse(list(self.model.args)).tensor_parallel_size  # the config checked it
        try:
            rows = self._own(self._rows())
        except (OSError, HotweightsError):
            return False
        return all(any(r.nbytes and r.tp == f"{rank}/{tp}" for r in rows) for rank in range(tp))

    def _demote(self, key: str, keep: bool = False) -> None:
        """``hotweights demote KEY``: a host copy made by a process with a CUDA context (the keeper has none)."""
        cmd = [sys.executable, "-m", "hotweights", "demote", key, "--json", *(["--keep"] if keep else [])]
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env(), timeout=600)
        if done.returncode != 0:
            raise EngineError(f"{self.model.name}: no host copy of {key}: "
                              f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")

    def host_copy_ahead(self) -> int:
        """Make the host copy of this (awake) model's entries now, keeping them on the GPU, so that its first park
        with ``parked_weights = "host"`` only lets the GPU copy go; the entries copied."""
        todo = [r for r in self._own(self._rows()) if r.nbytes and not r.host_nbytes]
        for row in todo:
            self._demote(row.key, keep=True)
        return len(todo)

    def start(self, timeout_s: float = 900.0) -> float:
        """Start the server and wait for ``/health``; the seconds it took. EngineError when it exits first."""
        self.stop()
        self.port = free_port()
        cmd, env = self.command()
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            log_from = log.tell()  # where this start's output begins
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        self.level = 0
        while time.monotonic() - began < timeout_s:
            if self.proc.poll() is not None:
                raise EngineError(f"{self.model.name}: its engine exited with code {self.proc.returncode} while "
                                  f"starting: {self.tail()}")
            if self.healthy():
                with open(self.log_path, "rb") as log:  # the launcher says which server it handed the start to
                    log.seek(log_from)
                    self.server = standby_server(log.read().decode(errors="replace"))
                return time.monotonic() - began
            time.sleep(0.1)
        self.stop()
        raise EngineError(f"{self.model.name}: not ready after {timeout_s:.0f} s: {self.tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def park(self, level: int) -> None:
        """Park at ``level`` (deeper only); where the engine cannot park, stop it."""
        if not self.parks:
            self.stop()
            return
        try:
            post(f"{self.url}/sleep?level={level}", timeout_s=120)
        except OSError as exc:
            raise EngineError(f"{self.model.name}: would not park: {exc}") from None
        self.level = max(self.level, level)

    def weights_to_host(self) -> str:
        """Let the GPU copies of the keeper's entries this parked engine maps go, keeping a host copy of each
        (made here if there is none yet; else a release of the device copy alone): its next wake uploads them.
        What happened, in a few words."""
        from ..client import connect
        from ..paths import daemon_paths
        pids = set(self.pids())
        rows = [r for r in self._rows() if r.nbytes and any(int(x.split(":")[0]) in pids
                                                             for x in r.parked.split(",") if x)]
        copied = 0
        for row in [r for r in rows if not r.host_nbytes]:
            self._demote(row.key)
            copied += 1
        with connect(daemon_paths(self.socket_dir or None)) as client:
            for row in [r for r in rows if r.host_nbytes]:
                client.release(row.key, tier="device")
        moved = sum(r.nbytes for r in rows)
        size = f"{moved / 2**30:.2f} GiB" if moved >= 2**30 else f"{moved / 2**20:.1f} MiB"
        made = "" if not copied else " (its host copy made)" if copied == 1 else f" ({copied} host copies made)"
        return f"{size} to host memory{made}"

    def wake(self) -> str:
        """Awake again: the source of its weights (``gpu``, ``host``, ``kept``, or ``start`` where it could not
        park and starts again). EngineError with the engine's reason when the wake is refused."""
        if not self.alive():
            self.start()
            return "start"
        try:
            post(f"{self.url}/wake_up", timeout_s=300)
        except OSError as exc:
            raise EngineError(f"{self.model.name}: would not wake: {exc}; {self.refusal()}") from None
        level, self.level = self.level, 0
        return self.woke_from() if level == 2 else "kept"

    def woke_from(self) -> str:
        text = self.tail(4000)
        for source in ("host", "gpu"):
            if f"(weights from {source})" in text.rsplit("Woke ", 1)[-1]:
                return source
        return "gpu"

    def refusal(self) -> str:
        lines = [x for x in self.tail(8000).splitlines() if "cannot wake" in x]
        return lines[-1].split("hotweights: ", 1)[-1] if lines else "see " + str(self.log_path)

    def tail(self, n: int = 600) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace").strip()
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``grace_s``."""
        proc, self.proc, self.server = self.proc, None, 0
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()
