"""The plugin inside real vLLM on a GPU (the CUDA build staged per ``../shared/gpu-vllm/``): what
only a GPU worker runs. Marked ``cuda``: skipped without a GPU, run on the GPU machine with
vLLM importable by this interpreter (``source /tmp/gpu-vllm/env.sh``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest
from conftest import run_cli
from conftest import serve_vllm as serve

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's CUDA build")]


@pytest.mark.timeout(600)
def test_a_strict_start_no_entry_can_serve_fails_at_device_setup_with_the_strict_message(models, daemon, tmp_path):
    """The cache holds the model as bfloat16 on this GPU; a strict float16 start at the default
    --gpu-memory-utilization must fail with the strict message and what to start with, before
    vLLM loads anything (not with vLLM's free-memory error, which a smaller utilization would
    only postpone)."""
    sock = str(daemon.paths.directory)
    pre = run_cli("preload", "--model", str(models["small"]), "--device", "cuda", "--dtype", "bfloat16",
                  "--socket-dir", sock)
    assert pre.returncode == 0, pre.stderr
    obs, _ = serve("strict_dtype", models["small"], tmp_path, "--dtype", "float16", "--load-format", "hotweights",
                   "--model-loader-extra-config", json.dumps({"socket_dir": sock, "fallback": False}),
                   expect_ready=False, python=sys.executable)
    log = obs.log_text()
    line = next((x for x in log.splitlines() if "Weight cache unusable (" in x), "")
    assert "and fallback is disabled" in line and "dtype: cached=bfloat16 requested=float16" in line, log[-4000:]
    assert "start with --dtype bfloat16" in line
    assert not re.search(r"Loading weights took|Model loading took|Free memory on device", log)
