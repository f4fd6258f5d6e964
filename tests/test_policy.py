"""Fallback policy: never silent. Strict mode fails fast with the evidence message.

Run: pytest tests/test_policy.py
"""

from __future__ import annotations

import fcntl
import logging
import os
import time

import pytest
from conftest import run_cli

from hotweights import evidence
from hotweights.config import AttachConfig
from hotweights.errors import WeightCacheUnusable
from hotweights.loading.policy import load_tensors


def test_strict_without_daemon_fails_fast_with_evidence(models, socket_dir):
    start = time.monotonic()
    with pytest.raises(WeightCacheUnusable) as err:
        load_tensors(models["tiny"], config=AttachConfig(socket_dir=str(socket_dir), fallback=False))
    elapsed = time.monotonic() - start
    assert str(err.value).startswith(
        f"Weight cache unusable (daemon unavailable: no daemon socket at {socket_dir}/daemon.sock) "
        f"and fallback is disabled")
    assert elapsed < 2.0, f"strict failure took {elapsed:.2f} s"


def test_strict_waits_state_timeout_for_a_starting_daemon(models, socket_dir):
    fd = os.open(socket_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # looks like a daemon that is still coming up
    try:
        start = time.monotonic()
        with pytest.raises(WeightCacheUnusable, match="was not ready within state_timeout_s=0.5"):
            load_tensors(models["tiny"], config=AttachConfig(socket_dir=str(socket_dir), fallback=False,
                                                              state_timeout_s=0.5))
        assert 0.5 <= time.monotonic() - start < 3.0
    finally:
        os.close(fd)


def test_fallback_logs_the_reason_and_loads_from_disk(models, socket_dir, caplog):
    caplog.set_level(logging.INFO, logger="hotweights")
    loaded = load_tensors(models["tiny"], config=AttachConfig(socket_dir=str(socket_dir)))
    assert loaded.source == "disk"
    reason = f"daemon unavailable: no daemon socket at {socket_dir}/daemon.sock"
    assert evidence.falling_back(reason) in caplog.messages


def test_write_through_publish_makes_the_next_start_warm(models, socket_dir, caplog):
    caplog.set_level(logging.INFO, logger="hotweights")
    try:
        first = load_tensors(models["small"], dtype="float16",
                             config=AttachConfig(socket_dir=str(socket_dir), publish=True))
        assert first.source == "disk+publish"
        assert any(m.startswith("Published 47 tensors") for m in caplog.messages)
        caplog.clear()
        second = load_tensors(models["small"], dtype="float16",
                              config=AttachConfig(socket_dir=str(socket_dir), fallback=False))
        assert second.source == "cache"
        assert any(m.startswith("Mapped 47 tensors") for m in caplog.messages)
        assert not any("falling back" in m for m in caplog.messages)
    finally:
        run_cli("stop", "--socket-dir", str(socket_dir))


def test_dtype_mismatch_strict_names_the_field(models, daemon):
    load_tensors(models["tiny"], dtype="float16",
                 config=AttachConfig(socket_dir=str(daemon.paths.directory), publish=True))
    with pytest.raises(WeightCacheUnusable) as err:
        load_tensors(models["tiny"], dtype="bfloat16",
                     config=AttachConfig(socket_dir=str(daemon.paths.directory), fallback=False))
    assert "dtype: cached=float16 requested=bfloat16" in str(err.value)
    assert err.value.reason.startswith("cached entry tiny [")


@pytest.mark.parametrize("data, message", [
    ({"mode": "mmap"}, "mode must be one of"),
    ({"fallback": "no"}, "fallback must be true or false"),
    ({"state_timeout_s": -1}, "state_timeout_s must be a number >= 0"),
    ({"fallbak": False}, "unknown weight-cache config keys ['fallbak']"),
])
def test_config_rejects_bad_values_by_name(data, message):
    with pytest.raises(ValueError) as err:
        AttachConfig.from_dict(data)
    assert message in str(err.value)


def test_write_through_publishes_to_the_daemon_named_by_socket_path(models, daemon, tmp_path, caplog):
    # before the one door (client.connect_for), publishing ignored socket_path: it started a
    # daemon at the socket_dir lookup instead, and the attach that followed missed
    caplog.set_level(logging.INFO, logger="hotweights")
    elsewhere = tmp_path / "elsewhere"
    config = AttachConfig(socket_dir=str(elsewhere), socket_path=str(daemon.paths.socket), publish=True)
    try:
        first = load_tensors(models["tiny"], dtype="float16", config=config)
        assert first.source == "disk+publish"
        assert not any("write-through publish not attachable" in m for m in caplog.messages)
        assert not (elsewhere / "daemon.sock").exists()
        second = load_tensors(models["tiny"], dtype="float16", config=AttachConfig(
            socket_path=str(daemon.paths.socket), fallback=False))
        assert second.source == "cache"
    finally:
        run_cli("stop", "--socket-dir", str(elsewhere))


def test_attach_first_tries_candidates_in_order_and_labels_reasons(models, daemon, caplog):
    from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
    from hotweights.loading.diagnosis import Candidate
    from hotweights.loading.policy import attach_first

    caplog.set_level(logging.INFO, logger="hotweights")
    config = AttachConfig(socket_dir=str(daemon.paths.directory))
    preloaded = run_cli("preload", "--model", str(models["tiny"]), "--dtype", "float16",
                        "--socket-dir", str(daemon.paths.directory))
    assert preloaded.returncode == 0, preloaded.stderr
    ckpt = open_checkpoint(models["tiny"])
    engine = checkpoint_key(ckpt, dtype="float16", layout="vllm/test")
    checkpoint = checkpoint_key(ckpt, dtype="float16")
    used = []

    def use(cand, attached):
        used.append(cand.label)
        if cand.label == "engine layout":
            raise ValueError("shapes differ")
        return attached.tensors

    candidates = [Candidate(engine, "engine layout"), Candidate(checkpoint, "checkpoint layout")]
    tensors, reason = attach_first(candidates, config, use)
    assert tensors and reason == "" and used == ["checkpoint layout"]  # the engine entry does not exist
    assert any(m.startswith("no usable engine layout entry (engine layout: cached entry") for m in caplog.messages)
    with pytest.raises(WeightCacheUnusable) as err:
        attach_first([Candidate(checkpoint, "engine layout"), Candidate(engine, "checkpoint layout")],
                     AttachConfig(socket_dir=str(daemon.paths.directory), fallback=False), use)
    assert "engine layout: engine-layout entry does not fit this model: shapes differ; checkpoint layout: " \
           "cached entry" in str(err.value)
