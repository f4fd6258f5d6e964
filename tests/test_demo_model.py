"""Demo checkpoints are deterministic and load offline in transformers.

Run: pytest tests/test_demo_model.py
"""

from __future__ import annotations

import hashlib

import pytest

from hotweights.demo_model import SHAPES, tensor_shapes, write_demo_model


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_size_writes_identical_bytes(tmp_path, models):
    again = write_demo_model(tmp_path / "again", "small")
    for f in sorted(models["small"].glob("*.safetensors")):
        assert digest(f) == digest(again / f.name)
    modes = {f.name: f.stat().st_mode & 0o777 for f in again.iterdir()}
    assert len(set(modes.values())) == 1, modes  # the shards as readable as the config (the umask's)


def test_tokenizer_is_byte_level_and_has_a_chat_template(models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["tiny"])
    ids = tok("Hé!").input_ids
    assert ids == [72, 195, 169, 33] and tok.decode(ids) == "Hé!"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("size, nbytes", [("1g", 1.0e9), ("0.6b", 1.19e9), ("8b", 16.38e9)])
def test_shapes_have_the_advertised_size(size, nbytes):
    s = SHAPES[size]
    itemsize = 4 if s.dtype == "float32" else 2
    total = sum(itemsize * _numel(shape) for _, shape in tensor_shapes(s))
    assert abs(total - nbytes) / nbytes < 0.12, total


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_a_model_linked_to_another_shares_every_shard_but_its_last_and_never_writes_through_a_link(tmp_path, models):
    import subprocess
    import sys

    base = models["small"]
    before = {f.name: digest(f) for f in base.glob("*.safetensors")}
    linked = write_demo_model(tmp_path / "m1", "small", seed=1, link_shards_from=base)
    first, last = sorted(f.name for f in linked.glob("*.safetensors"))
    assert (linked / first).stat().st_ino == (base / first).stat().st_ino
    assert (linked / last).stat().st_ino != (base / last).stat().st_ino
    assert digest(linked / last) != before[last]  # other bytes: another model
    write_demo_model(linked, "small", seed=2)  # written whole again over its links: the base stays as it was
    assert {f.name: digest(f) for f in base.glob("*.safetensors")} == before
    assert (linked / first).stat().st_ino != (base / first).stat().st_ino
    done = subprocess.run([sys.executable, "-m", "hotweights", "demo-model", str(tmp_path / "m2"), "--size", "tiny",
                           "--link-shards-from", str(base)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == ("hotweights demo-model: the tiny demo model has one "
                                                            "shard: nothing to link (write it whole)"), done.stderr
