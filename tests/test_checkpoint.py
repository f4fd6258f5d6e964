"""Checkpoint reading: headers-only keys and validation on first use.

Run: pytest tests/test_checkpoint.py
"""

from __future__ import annotations

import json

import pytest

from hotweights.errors import CheckpointError
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint


def test_key_from_headers_only_matches_and_bad_entries_surface_when_read(models, tmp_path):
    full, fast = open_checkpoint(models["small"]), open_checkpoint(models["small"], validate=False)
    assert checkpoint_key(fast, dtype="float16") == checkpoint_key(full, dtype="float16")
    assert fast.shards[0].tensors == full.shards[0].tensors  # parsed on first use
    model = tmp_path / "m"
    model.mkdir()
    header = json.dumps({"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    (model / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    ckpt = open_checkpoint(model, validate=False)  # a key can be computed; it matches no entry
    with pytest.raises(CheckpointError, match="unsupported dtype 'C64'"):
        ckpt.validate()
    with pytest.raises(CheckpointError, match="unsupported dtype 'C64'"):
        open_checkpoint(model)


def test_inspect_prints_the_key_without_a_daemon(models):
    from conftest import run_cli

    r = run_cli("inspect", "--model", str(models["tiny"]), "--dtype", "float16", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    key = checkpoint_key(open_checkpoint(models["tiny"]), dtype="float16")
    assert data == {"model": key.model, "arch": key.arch, "dtype": "float16", "key": key.short,
                    "shards": [s.content_digest for s in key.shards]}
