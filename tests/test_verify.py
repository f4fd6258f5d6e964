"""verify: a healthy engine passes, and each planted fault fails exactly the right checks.

Run: pytest tests/test_verify.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import free_port, run_cli

from hotweights.verify.config import ENGINE_CMDS, PRELOAD_CMD, VerifyConfig
from hotweights.verify.verify import verify

pytestmark = pytest.mark.slow  # real server processes; `make test-fast` skips them

FAULT_ENGINE = str(Path(__file__).with_name("fault_engine.py"))


def failed(receipts: dict) -> set[str]:
    return {c["name"] for c in receipts["checks"] if not c["passed"]}


def config(models, tmp_path, **kw) -> VerifyConfig:
    return VerifyConfig(model=str(models["tiny"]), dtype="bfloat16", out=str(tmp_path / "out"), port=free_port(),
                        max_tokens=6, timeout_s=120, interval_s=0.1, **kw)


def test_healthy_engine_passes_and_writes_every_receipt(models, tmp_path):
    out = tmp_path / "out"
    result = run_cli("--log-level", "warning", "verify", "--model", str(models["tiny"]), "--out", str(out),
                     "--port", str(free_port()), "--max-tokens", "6", "--json", timeout=600)
    receipts = json.loads(result.stdout)
    assert result.returncode == 0 and receipts["passed"], failed(receipts)
    for name in ("environment.json", "disk_cold.json", "disk.json", "disk.log", "warm1.json", "warm2.json",
                 "receipts.json", "report.md", "report.html", "drill_fallback_off.json", "daemon.log"):
        assert (out / name).exists(), name
    assert set(receipts["memory"]) == {"none", "daemon_only", "daemon_engine", "engine_stopped", "parked_level1",
                                       "parked_level2"}
    park = [c for c in receipts["checks"] if c["name"].startswith("park drill")]
    assert len(park) == 3 and all(c["passed"] for c in park), park
    assert "0 pool mappings while parked" in next(c["detail"] for c in park if "level 2" in c["name"])
    # deep-parked, the engine maps none of the keeper's pools: its shared memory goes
    engine = receipts["memory"]["daemon_engine"]["engine"]
    assert receipts["memory"]["parked_level2"]["engine"]["RssShmem"] < engine["RssShmem"]
    assert receipts["memory"]["none"]["pool_bytes"] == 0 < receipts["memory"]["daemon_only"]["pool_bytes"]
    assert "<svg" in (out / "report.html").read_text()
    assert set(receipts["runs"]["warm1"]["phases"]) >= {"imports", "weights", "warmup"}
    report = (out / "report.md").read_text()
    assert "the weights phase:" in report and "with it evicted first" in report
    assert receipts["runs"]["disk_cold"]["page_cache"] < 0.5 and receipts["runs"]["disk"]["page_cache"] > 0.9
    daemon_check = next(c for c in receipts["checks"] if c["name"] == "daemon READY line")
    assert daemon_check["passed"] and Path(daemon_check["detail"]).exists()  # the log named outlives the run
    assert json.loads((out / "warm1.json").read_text())["ready"] is True


def test_engine_that_silently_loads_from_disk_fails_the_evidence_checks(models, tmp_path):
    cmd = f"{sys.executable} {FAULT_ENGINE} silent_disk " + ENGINE_CMDS["hotweights"].split("serve ", 1)[1]
    code, receipts = verify(config(models, tmp_path, engine_cmd=cmd))
    assert code == 1
    assert failed(receipts) == {"warm1 Mapped evidence", "warm2 Mapped evidence",
                                "drill: no daemon + fallback on -> ready, fallback logged",
                                "drill: no daemon + fallback off -> fails fast", "drill: dtype mismatch reported"}


def test_engine_whose_answer_differs_fails_only_the_answer_checks(models, tmp_path):
    cmd = f"{sys.executable} {FAULT_ENGINE} wrong_answer " + ENGINE_CMDS["hotweights"].split("serve ", 1)[1]
    code, receipts = verify(config(models, tmp_path, engine_cmd=cmd))
    assert code == 1
    assert failed(receipts) == {"warm1 same answer as disk", "warm2 same answer as disk",
                                "park drill: level 1 -> wake -> same answer",
                                "park drill: level 2 -> wake -> same answer"}
    detail = next(c["detail"] for c in receipts["checks"] if c["name"] == "warm1 same answer as disk")
    assert "PLANTED" in detail


def test_daemon_holding_another_dtype_fails_the_dtype_check(models, tmp_path):
    code, receipts = verify(config(models, tmp_path, preload_cmd=PRELOAD_CMD.replace("{dtype}", "float16")))
    assert code == 1
    checks = {c["name"]: c for c in receipts["checks"]}
    assert not checks["daemon holds the requested dtype"]["passed"]
    assert "requested bfloat16" in checks["daemon holds the requested dtype"]["detail"]
    assert "float16 on cpu" in checks["daemon holds the requested dtype"]["detail"]
    assert not checks["warm1 ready (fallback disabled)"]["passed"]
    assert "dtype: cached=float16 requested=bfloat16" in checks["warm1 ready (fallback disabled)"]["detail"]


def test_observe_records_early_exit(tmp_path):
    out = tmp_path / "obs"
    result = run_cli("observe", "dead", "--out", str(out), "--interval", "0.1", "--health-url",
                     f"http://127.0.0.1:{free_port()}/health", "--", sys.executable, "-c", "raise SystemExit(3)")
    receipt = json.loads((out / "dead.json").read_text())
    assert result.returncode == 1 and receipt["ready"] is False and receipt["exit_code"] == 3
    assert set(receipt) >= {"label", "started_utc", "ready", "elapsed_s", "pid", "command"}
