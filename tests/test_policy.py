"""Fallback policy: never silent. Strict mode fails fast with the evidence message.

Run: pytest tests/test_policy.py
"""

from __future__ import annotations

import fcntl
import logging
import os
import time

import pytest

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
        from conftest import run_cli

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
