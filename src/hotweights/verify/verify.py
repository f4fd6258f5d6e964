"""``hotweights verify``: the acceptance procedure, run for real, with receipts.

Steps: environment record -> a disk start with the checkpoint evicted from the page cache
(``disk_cold``, unless ``cold=False``) -> the disk baseline (page cache warm) -> preload -> warm1
and warm2 with the fallback disabled -> the park drill (the embedded engine, and vLLM on a GPU with
``--enable-sleep-mode``: park, memory while parked, wake, the same answer; a deep park, the weights
unmapped, wake, the same answer) -> memory at four points -> drills (no daemon + fallback on, no daemon +
fallback off, dtype mismatch) -> verdict. Each check is a ``Check`` that can fail on its own and says why in
one line. Every server run is an ``observe`` run with its own log and JSON receipt under ``--out``; its memory
is counted over its processes, the server a warm standby forked for the launcher included.

The daemon lives in a private socket directory made for the run, so verify never
touches a production daemon. Engines are command templates (``--engine-cmd``), which
is how other engines plug in and how the tests plant faults.

Not covered: multi-node runs; TP > 1 on the embedded engine."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ..errors import CheckpointError
from ..evidence import FALLBACK_MARK, MAPPED_RE, PARKED_RE, READY_MARK, STRICT_MARK, UNUSABLE_MARK, WOKE_RE
from ..evidence import is_evidence, parse_startup, standby_server
from ..observe import Observed, complete, floor_s, post, require_free_port
from ..standby.handoff import serving_pids
from .config import ENGINE_CMDS, Check, Run, VerifyConfig
from .environment import host_record
from .memory import evict_page_cache, page_cache_resident, pool_mappings
from .vllm_log import phases as vllm_phases


class Procedure:
    def __init__(self, config: VerifyConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.socket_dir = Path(tempfile.mkdtemp(prefix="hwv-", dir="/tmp"))
        self.checks: list[Check] = []
        self.runs: dict[str, Run] = {}
        self.memory: dict[str, dict] = {}
        self.env: dict = {}
        self.dtype = config.dtype

    # -- helpers ----------------------------------------------------------------------

    def check(self, name: str, passed: bool, detail: str) -> bool:
        self.checks.append(Check(name, bool(passed), detail))
        return bool(passed)

    def _fmt(self, template: str, **extra: str) -> list[str]:
        values = {"python": sys.executable, "vllm_python": os.environ.get("HOTWEIGHTS_VLLM_PYTHON", sys.executable),
                  "model": self.config.model, "port": str(self.config.port), "dtype": self.dtype,
                  "device": self.config.device, "tp": str(self.config.tp_size), "socket_dir": str(self.socket_dir),
                  **extra}
        return [part.format(**values) for part in shlex.split(template)]

    def _engine_env(self) -> dict[str, str]:
        # vLLM's CPU build reserves most of the RAM for its KV cache unless told otherwise
        kv_space = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                    "HOTWEIGHTS_SOCKET_DIR": str(self.socket_dir)}  # its standbys too: never the user's directory
        return kv_space if self.config.engine == "vllm" else {}

    def _run_cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hotweights", *args], capture_output=True, text=True)

    def serve(self, label: str, *, load_format: str, extra: dict | None = None, dtype: str | None = None,
              measure: str | None = None, during: Callable[[str, list[int]], None] | None = None,
              flags: tuple[str, ...] = ()) -> Run:
        require_free_port(self.config.port)  # else /health may answer from a server we did not start
        print(f"verify: {label}: starting the server ({self.config.engine}, load format {load_format})",
              file=sys.stderr, flush=True)
        template = self.config.engine_cmd or ENGINE_CMDS[self.config.engine]
        cmd = self._fmt(template, load_format=load_format, extra=json.dumps(extra or {}), dtype=dtype or self.dtype)
        cmd += flags
        url = f"http://127.0.0.1:{self.config.port}"
        env = self._engine_env() | ({"VLLM_SERVER_DEV_MODE": "1"} if "--enable-sleep-mode" in flags else {})
        page_cache = page_cache_resident(self.config.model)
        with Observed(label, cmd, out_dir=self.out, health_url=url + "/health", env=env) as obs:
            receipt = obs.wait_ready(timeout_s=self.config.timeout_s, interval_s=self.config.interval_s)
            answer = self._complete(url) if receipt.ready else None
            pids = serving_pids(obs.proc.pid, standby_server(obs.log_text())) if receipt.ready else []
            if measure and receipt.ready:
                self.memory[measure] = self._memory(engine_pids=pids)
            if during is not None and receipt.ready:
                during(url, pids)
            obs.stop()
            log = obs.log_text()
        phases = (vllm_phases(log, receipt.started_utc, receipt.elapsed_s) if self.config.engine == "vllm"
                  else (parse_startup(log) or {}).get("phases"))
        run = Run(label, receipt.ready, receipt.elapsed_s, answer, str(obs.log_path),
                  [line for line in log.splitlines() if is_evidence(line)], None if receipt.ready else
                  obs.proc.returncode, phases, page_cache, phases["weights"] if phases else None)
        receipt.extra.update(answer=answer, evidence=run.evidence, phases=run.phases, page_cache=page_cache,
                             weights_s=run.weights_s)
        obs.write()
        self.runs[label] = run
        return run

    def _complete(self, url: str) -> str | None:  # vLLM serves the model under its path
        return complete(url, self.config.prompt, max_tokens=self.config.max_tokens,
                        model=self.config.model if self.config.engine == "vllm" else None)

    def _memory(self, engine_pids: list[int] | None = None) -> dict:
        from .memory import sample

        return sample(self.config.device, socket_dir=self.socket_dir, engine_pids=engine_pids)

    # -- the procedure ------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.environment()
            self.memory["none"] = self._memory()
            if self.config.cold:
                self.disk_baseline("disk_cold")
            self.disk_baseline()
            if self.preload():
                self.memory["daemon_only"] = self._memory()
                for label in ("warm1", "warm2"):
                    self.warm(label)
                if self.config.engine == "hotweights" or (self.config.device != "cpu" and not self.config.engine_cmd):
                    self.park_drill()  # vLLM's CPU build has no sleep mode
                self.memory["engine_stopped"] = self._memory()
            self.drills()
        finally:
            self._run_cli("stop", "--socket-dir", str(self.socket_dir))
            if (self.socket_dir / "daemon.log").exists():  # the run's private directory goes; its log stays
                shutil.copyfile(self.socket_dir / "daemon.log", self.out / "daemon.log")
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        return 0 if all(c.passed for c in self.checks) else 1

    def environment(self) -> None:
        inspected = self._run_cli("inspect", "--model", self.config.model, "--dtype", self.config.dtype, "--json")
        if inspected.returncode != 0:
            lines = inspected.stderr.strip().splitlines() or [f"cannot read {self.config.model}"]
            raise CheckpointError(lines[-1].removeprefix("hotweights inspect: "))
        key = json.loads(inspected.stdout)
        self.dtype = key["dtype"]
        self.env = {**host_record(self.config.device),
                    "engine": self.config.engine, "model": str(Path(self.config.model).resolve()), "arch": key["arch"],
                    "model_digest": key["key"], "shards": key["shards"],
                    "dtype": self.dtype, "device": self.config.device, "tp": self.config.tp_size, "dp": 1}
        # the floor, in this run; then one import of the server's own modules: both put the files a start
        # imports in the page cache, so the first (disk) start imports as the warm ones do
        python = self._fmt("{vllm_python}" if self.config.engine == "vllm" else "{python}")[0]
        self.env["floor_s"] = round(floor_s(python, self.config.device), 3)
        server = "vllm.entrypoints.openai.api_server" if self.config.engine == "vllm" else "hotweights.serve.web"
        subprocess.run([python, "-c", f"import {server}, hotweights.engines.transformers"], capture_output=True)
        (self.out / "environment.json").write_text(json.dumps(self.env, indent=2))
        what = f"{key['arch']} {self.dtype} digest {key['key']} on {self.config.device}"
        self.check("environment recorded", True, what)

    def disk_baseline(self, label: str = "disk") -> None:
        if label == "disk_cold":  # a node whose page cache was reclaimed: the start reads the drive
            evict_page_cache(self.config.model)
        run = self.serve(label, load_format="auto")
        what = "disk start, page cache evicted," if label == "disk_cold" else "disk baseline"
        self.check(f"{what} ready", run.ready, f"ready in {run.elapsed_s:.2f} s" if run.ready else
                   f"not ready (exit {run.exit_code}); see {run.log_path}")
        if label == "disk_cold":
            return
        if (cold := self.runs.get("disk_cold")) and cold.ready:
            self.check("disk starts answer alike (page cache evicted, warm)", cold.answer == run.answer,
                       "identical" if cold.answer == run.answer else f"evicted={cold.answer!r} warm={run.answer!r}")
        self.check("disk baseline answered", bool(run.answer),
                   repr(run.answer) if run.answer else "empty or no answer: answer comparisons would prove "
                                                        "nothing; try another --prompt")

    def preload(self) -> bool:
        print("verify: preload: filling the cache", file=sys.stderr, flush=True)
        start = time.monotonic()
        result = subprocess.run(self._fmt(self.config.preload_template), capture_output=True, text=True,
                                env={**os.environ, **self._engine_env()})
        elapsed = time.monotonic() - start
        (self.out / "preload.log").write_text(result.stdout + result.stderr)
        ok = self.check("preload succeeded", result.returncode == 0,
                        f"prep {elapsed:.2f} s" if result.returncode == 0 else result.stderr.strip()[-300:])
        self.runs["preload"] = Run("preload", ok, round(elapsed, 3), None, str(self.out / "preload.log"))
        daemon_log = (self.socket_dir / "daemon.log")
        ready = daemon_log.exists() and f"{READY_MARK}: socket=" in daemon_log.read_text()
        self.check("daemon READY line", ready, str(self.out / "daemon.log"))  # copied there at the end
        status = self._run_cli("status", "--json", "--socket-dir", str(self.socket_dir))
        entries = json.loads(status.stdout)["entries"] if status.returncode == 0 else []
        held = [f"{e['dtype']} on {e['device']}" for e in entries]
        want_device = "cpu" if self.config.device == "cpu" else "cuda:"
        match = any(e["dtype"] == self.dtype and e["device"].startswith(want_device) for e in entries)
        self.check("daemon holds the requested dtype", match,
                   f"requested {self.dtype} on {self.config.device}; daemon holds {held or 'nothing'}")
        return ok

    def warm(self, label: str) -> None:
        extra = {"socket_dir": str(self.socket_dir), "fallback": False}
        run = self.serve(label, load_format="hotweights", extra=extra,
                         measure="daemon_engine" if label == "warm1" else None)
        self.check(f"{label} ready (fallback disabled)", run.ready,
                   f"ready in {run.elapsed_s:.2f} s" if run.ready else _why(run))
        mapped = [e for e in run.evidence if MAPPED_RE.search(e)]
        ranks = self.config.tp_size  # every rank maps its own entry and logs its own line
        self.check(f"{label} Mapped evidence", len(mapped) >= ranks,
                   (f"{len(mapped)} of {ranks} ranks; " if ranks > 1 else "")
                   + (mapped[0].split("Mapped ", 1)[1][:120] if mapped else f"no 'Mapped' line in {run.log_path}"))
        fallback = [e for e in run.evidence if FALLBACK_MARK in e]
        self.check(f"{label} no fallback line", not fallback, fallback[0][-160:] if fallback else "none")
        base = self.runs["disk"].answer
        self.check(f"{label} same answer as disk", run.answer is not None and run.answer == base,
                   "identical" if run.answer == base else f"disk={base!r} {label}={run.answer!r}")

    def park_drill(self) -> None:
        """Park (level 1) -> memory while parked -> wake -> the same answer; deep park (level 2) -> none of the
        keeper's pools mapped, memory back to the parked residue -> wake -> the same answer."""
        base = self.runs["disk"].answer

        def steps(url: str, pids: list[int]) -> None:
            for level in (1, 2):
                began = time.perf_counter()
                post(f"{url}/sleep?level={level}")
                parked_s = time.perf_counter() - began
                self.memory[f"parked_level{level}"] = self._memory(engine_pids=pids)
                mapped = sum(n for p in pids if (n := pool_mappings(p)) > 0)  # -1: gone
                began = time.perf_counter()
                post(f"{url}/wake_up")
                woke_s = time.perf_counter() - began
                answer = self._complete(url)
                unmapped = level == 1 or mapped == 0
                self.check(f"park drill: level {level} -> wake -> same answer",
                           answer == base and unmapped,
                           f"parked in {parked_s:.3f} s, woke in {woke_s:.3f} s, "
                           + ("identical" if answer == base else f"disk={base!r} woken={answer!r}")
                           + ("" if level == 1 or self.config.device != "cpu"  # GPU pools do not show in maps
                              else f"; {mapped} pool mappings while parked"))

        strict = {"socket_dir": str(self.socket_dir), "fallback": False}
        vllm = self.config.engine == "vllm"
        run = self.serve("park", load_format="hotweights", extra=strict, during=steps,
                         flags=("--enable-sleep-mode",) if vllm else ())
        parked = [m for e in run.evidence if (m := PARKED_RE.search(e))]
        woke = [e for e in run.evidence if WOKE_RE.search(e)]
        ranks = self.config.tp_size if vllm else 1  # every vLLM worker parks and wakes on its own
        said = [m.group(5) for m in parked] == ["weights kept mapped"] * ranks + ["weights unmapped"] * ranks
        self.check("park drill: Parked and Woke evidence",
                   run.ready and len(parked) == 2 * ranks and len(woke) == 2 * ranks and said,
                   f"{len(parked)} Parked and {len(woke)} Woke lines"
                   + ("" if said else "; the level 1 lines must keep the weights mapped, the level 2 ones unmap them")
                   if run.ready else _why(run))

    def drills(self) -> None:
        self._run_cli("stop", "--socket-dir", str(self.socket_dir))
        run = self.serve("drill_fallback_on", load_format="hotweights", extra={"socket_dir": str(self.socket_dir)})
        logged = any(FALLBACK_MARK in e for e in run.evidence)
        self.check("drill: no daemon + fallback on -> ready, fallback logged", run.ready and logged,
                   _why(run) if not run.ready else ("fallback line present" if logged else "no fallback line"))
        start = time.monotonic()
        run = self.serve("drill_fallback_off", load_format="hotweights",
                         extra={"socket_dir": str(self.socket_dir), "fallback": False})
        failed_s = time.monotonic() - start
        strict = any(STRICT_MARK in e for e in run.evidence)
        self.check("drill: no daemon + fallback off -> fails fast", not run.ready and strict,
                   f"failed in {failed_s:.1f} s with the evidence message" if strict and not run.ready
                   else "started anyway" if run.ready else "failed without the evidence message")
        other = "bfloat16" if self.dtype != "bfloat16" else "float16"
        subprocess.run(self._fmt(self.config.preload_template), capture_output=True, text=True,
                       env={**os.environ, **self._engine_env()})
        run = self.serve("drill_dtype_mismatch", load_format="hotweights", dtype=other,
                         extra={"socket_dir": str(self.socket_dir), "fallback": False})
        diff = f"dtype: cached={self.dtype} requested={other}"
        reported = any(diff in e for e in run.evidence)
        self.check("drill: dtype mismatch reported", reported and not run.ready,
                   f"'{diff}' reported" if reported else f"no '{diff}' in {run.log_path}")

    def receipts(self) -> dict:
        return {"env": self.env, "checks": [asdict(c) for c in self.checks],
                "runs": {k: asdict(v) for k, v in self.runs.items()}, "memory": self.memory,
                "passed": all(c.passed for c in self.checks)}


def _why(run: Run) -> str:
    line = next((e for e in run.evidence if UNUSABLE_MARK in e), "")
    reason = line[line.find(UNUSABLE_MARK):][:300]  # the reason first: it names what differs
    return f"not ready (exit {run.exit_code}): {reason}" if reason else f"not ready; see {run.log_path}"


def verify(config: VerifyConfig) -> tuple[int, dict]:
    from .report import write_reports

    proc = Procedure(config)
    code = proc.run()
    receipts = proc.receipts()
    write_reports(receipts, Path(config.out))
    return code, receipts
