"""The strict preflight (``engines/vllm/preflight.py``): how it reads vLLM's command line and
that a strict start no entry can serve fails at once, against a real daemon.

Run: pytest tests/test_vllm_preflight.py
"""

from __future__ import annotations

import json

import pytest

from hotweights.engines.vllm.preflight import check, strict_target


@pytest.mark.parametrize("argv, target", [
    (["--model", "/m/qwen", "--load-format", "hotweights", "--model-loader-extra-config", '{"fallback": false}'],
     ("/m/qwen", {"fallback": False})),
    (["serve", "/m/qwen", "--load-format=hotweights", '--model-loader-extra-config={"fallback": false}'],
     ("/m/qwen", {"fallback": False})),
    (["--model", "/m/qwen", "--load-format", "hotweights"], None),  # fallback on: the loader decides
    (["--model", "/m/qwen", "--load-format", "auto", "--model-loader-extra-config", '{"fallback": false}'], None),
    (["--model", "/m/qwen", "--load-format", "hotweights", "--model-loader-extra-config", "{bad"], None),
])
def test_preflight_reads_the_command_line(argv, target):
    assert strict_target(argv) == target


def test_preflight_fails_a_strict_start_at_once(socket_dir, daemon, caplog, tmp_path):
    missing = ["--model", str(tmp_path / "qwen"), "--load-format", "hotweights", "--model-loader-extra-config"]
    with pytest.raises(SystemExit):
        check(missing + [json.dumps({"fallback": False, "socket_dir": str(tmp_path / "none")})])
    assert "Weight cache unusable (daemon unavailable: no daemon socket at" in caplog.text
    with pytest.raises(SystemExit):  # a daemon that holds nothing of this model
        check(missing + [json.dumps({"fallback": False, "socket_dir": str(daemon.paths.directory)})])
    assert "Weight cache unusable (cache miss for qwen: the daemon holds no entry of this model" in caplog.text
