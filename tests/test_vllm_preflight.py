"""The strict preflight (``engines/vllm/preflight.py``): how it reads vLLM's command line and
that a strict start no entry can serve fails at once, against a real daemon.

Run: pytest tests/test_vllm_preflight.py
"""

from __future__ import annotations

import json

import pytest

from hotweights.engines.vllm.preflight import check as check_start
from hotweights.engines.vllm.preflight import strict_target
from hotweights.engines.vllm.start import VllmStart


def check(argv: list[str]) -> None:
    check_start(VllmStart.parse(argv))


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


def test_a_strict_start_in_a_dtype_the_cache_does_not_hold_fails_at_once(models, daemon, caplog):
    from conftest import run_cli

    sock = str(daemon.paths.directory)
    preloaded = run_cli("preload", "--model", str(models["tiny"]), "--dtype", "float32", "--socket-dir", sock)
    assert preloaded.returncode == 0, preloaded.stderr
    argv = ["serve", str(models["tiny"]), "--load-format", "hotweights", "--model-loader-extra-config",
            json.dumps({"fallback": False, "socket_dir": sock})]
    check([*argv, "--dtype", "float"])  # float is float32: no exit
    check(argv)  # auto: the loader decides
    with pytest.raises(SystemExit):
        check([*argv, "--dtype", "half"])
    assert ("Weight cache unusable (cached entries of tiny differ: dtype: cached=float32 requested=float16) and "
            "fallback is disabled; "
            "start with --dtype float32, or make a float16 entry (hotweights preload --engine vllm --model "
            f"{models['tiny']} --dtype float16), or set fallback to true") in caplog.text


def test_preflight_fails_a_strict_start_at_once(socket_dir, daemon, caplog, tmp_path):
    missing = ["--model", str(tmp_path / "qwen"), "--load-format", "hotweights", "--model-loader-extra-config"]
    with pytest.raises(SystemExit):
        check(missing + [json.dumps({"fallback": False, "socket_dir": str(tmp_path / "none")})])
    assert "Weight cache unusable (daemon unavailable: no daemon socket at" in caplog.text
    # the hint is vLLM's preload (its engine layout), not the checkpoint layout's
    assert f"preload the model for vLLM (hotweights preload --engine vllm --model {tmp_path / 'qwen'})" in caplog.text
    with pytest.raises(SystemExit):  # a daemon that holds nothing of this model
        check(missing + [json.dumps({"fallback": False, "socket_dir": str(daemon.paths.directory)})])
    assert "Weight cache unusable (cache miss for qwen: the daemon holds no entry of this model" in caplog.text
