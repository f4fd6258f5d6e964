"""Manifest/TensorSpec: every inconsistency is rejected at construction, naming the tensor.

Run: pytest tests/test_manifest.py
"""

from __future__ import annotations

import pytest

from hotweights.errors import ManifestError
from hotweights.key import CacheKey, ShardId
from hotweights.manifest import Manifest, PoolSpec, TensorSpec, pack

KEY = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="float16")


@pytest.mark.parametrize("name, dtype, shape, stride, nbytes", [
    ("scalar", "float32", (), (), 4),
    ("empty", "float16", (0, 7), (7, 1), 0),
    ("bf16", "bfloat16", (3, 5), (5, 1), 30),
    ("fp8", "float8_e4m3fn", (4,), (1,), 4),
    ("transposed", "float32", (5, 3), (1, 5), 60),
    ("broadcast", "float16", (4, 4), (0, 1), 8),
])
def test_edge_case_specs_are_accepted(name, dtype, shape, stride, nbytes):
    spec = TensorSpec(name, dtype, shape, stride, 0, 0, nbytes)
    assert TensorSpec.from_wire(spec.to_wire()) == spec


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="float128"), "tensor 't': unknown dtype 'float128'"),
    (dict(shape=(2, -1), stride=(1, 1)), "must be non-negative ints"),
    (dict(shape=(2,), stride=(1, 1)), "one rank"),
    (dict(offset=3), "offset 3 must be a non-negative multiple of 2"),
    (dict(nbytes=7), "nbytes 7 != 8"),
    (dict(shape=(1 << 40, 1 << 40), stride=(1 << 40, 1), nbytes=0), "overflows"),
])
def test_bad_specs_are_rejected_with_the_tensor_named(kwargs, message):
    base = dict(name="t", dtype="float16", shape=(4,), stride=(1,), pool=0, offset=0, nbytes=8)
    base.update(kwargs)
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TensorSpec(**base)


def test_manifest_reports_every_problem_at_once():
    tensors = (
        TensorSpec("a", "float16", (8,), (1,), 0, 0, 16),
        TensorSpec("a", "float16", (8,), (1,), 0, 0, 16),
        TensorSpec("liar", "float32", (100,), (1,), 0, 0, 400),
        TensorSpec("ghost", "float32", (1,), (1,), 5, 0, 4),
    )
    with pytest.raises(ManifestError) as err:
        Manifest(KEY, (PoolSpec(256, "cpu"),), tensors, {"lm_head.weight": "missing", "a": "a"})
    text = str(err.value)
    for fragment in ("tensor 'a' appears twice", "tensor 'liar': bytes 0..400 exceed pool 0 of 256 bytes",
                     "tensor 'ghost': pool 5 does not exist", "alias 'lm_head.weight' points to missing tensor",
                     "alias 'a' is also a tensor name"):
        assert fragment in text


def test_pool_device_must_match_key_device():
    with pytest.raises(ManifestError, match="does not match key device cpu"):
        Manifest(KEY, (PoolSpec(256, "cuda:GPU-1"),), ())


def test_wire_roundtrip_with_aliases():
    pools, specs = pack([("w", "float16", (4, 4)), ("b", "float32", (4,))], pool_bytes=1 << 20, device="cpu")
    m = Manifest(KEY, pools, specs, {"lm_head.weight": "w"}, 1.5)
    assert Manifest.from_wire(m.to_wire()) == m


def test_pack_aligns_fills_pools_in_order_and_gives_big_tensors_their_own_pool():
    pools, specs = pack([("a", "float16", (10,)), ("b", "float32", (1000,)), ("c", "int8", (5,)),
                         ("big", "float32", (3000,))], pool_bytes=8192, device="cpu")
    assert [(s.name, s.pool, s.offset) for s in specs] == [("a", 0, 0), ("b", 0, 256), ("c", 0, 4352), ("big", 1, 0)]
    assert [p.nbytes for p in pools] == [4357, 12000]
