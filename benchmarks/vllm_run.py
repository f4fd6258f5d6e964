"""One vLLM start, for the benchmarks: run it, time it to ``/health`` 200, ask one greedy question, stop it,
read its log (``verify/vllm_log.facts`` and ``phases``). Imported by the scripts beside it.
"""

from __future__ import annotations

from pathlib import Path

from hotweights.observe import Observed, complete
from hotweights.verify.vllm_log import facts, phases


def run_vllm(label: str, cmd: list[str], *, out: Path, port: int, env: dict[str, str] | None = None,
             timeout_s: float = 580, model: str | None = None, grace_s: float = 20) -> dict:
    """``cmd`` (a server listening on 127.0.0.1:``port``) as one timed start: ready, ready_s, the answer
    (when ``model`` is given), the start's phases, every fact of its log, its exit code and log text."""
    with Observed(label, cmd, out_dir=out, health_url=f"http://127.0.0.1:{port}/health", env=env) as obs:
        receipt = obs.wait_ready(timeout_s=timeout_s, interval_s=0.2)
        answer = (complete(f"http://127.0.0.1:{port}", "The weight cache", model=model)
                  if receipt.ready and model is not None else None)
        obs.stop(grace_s=grace_s)
        log = obs.log_text()
    return {"ready": receipt.ready, "ready_s": receipt.elapsed_s, "answer": answer,
            "phases": phases(log, receipt.started_utc, receipt.elapsed_s) if receipt.ready else None,
            **facts(log), "exit_code": obs.proc.returncode, "log": log}
