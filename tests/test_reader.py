"""Block reader: elements split across block boundaries are cast exactly; digests match hash_file.

Run: pytest tests/test_reader.py
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from hotweights.loading import digest, reader
from hotweights.loading.checkpoint import open_checkpoint
from hotweights.loading.preload import load_checkpoint


@pytest.mark.parametrize("block", [1001, 4096])
@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
def test_small_blocks_split_elements_and_stay_exact(tmp_path, monkeypatch, block, dtype):
    monkeypatch.setattr(reader, "BLOCK_BYTES", block)
    monkeypatch.setattr(digest, "BLOCK_BYTES", block)
    gen = torch.Generator().manual_seed(0)
    tensors = {  # odd sizes: later tensors start at offsets that are not multiples of 4 or 8
        "a": torch.randn(333, generator=gen).to(torch.bfloat16),
        "b": torch.randn(17, 29, generator=gen),
        "c": torch.arange(101, dtype=torch.int64),
        "d": torch.randn(1, generator=gen).to(torch.float16),
        "e": torch.randn(999, generator=gen).to(torch.float16),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    ckpt = open_checkpoint(tmp_path)
    writer, digests = load_checkpoint(ckpt, dtype=dtype, device="cpu", pool_bytes=1 << 20)
    try:
        want = getattr(torch, dtype)
        for name, t in load_file(tmp_path / "model.safetensors").items():
            expected = t.to(want) if t.is_floating_point() else t
            assert torch.equal(writer.dest(name), expected), name
        assert digests["model.safetensors"] == digest.hash_file(tmp_path / "model.safetensors")
    finally:
        writer.close()
