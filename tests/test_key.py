"""CacheKey: equality means identical bytes; a near miss is reported field by field.

Run: pytest tests/test_key.py
"""

from __future__ import annotations

import dataclasses

import pytest

from hotweights.key import CacheKey, FieldDiff, ShardId, pool_device


def make_key(**overrides) -> CacheKey:
    base = dict(shards=(ShardId("model.safetensors", 100, "h1", "c1"),), arch="Qwen3ForCausalLM",
                dtype="float16", model="tiny")
    base.update(overrides)
    return CacheKey(**base)


def test_diff_reports_every_differing_field_exactly():
    cached = make_key()
    requested = make_key(dtype="bfloat16", tp_size=2, tp_rank=1, device_kind="cuda", device_id="GPU-1")
    assert [str(d) for d in cached.diff(requested)] == [
        "dtype: cached=float16 requested=bfloat16",
        "tp_size: cached=1 requested=2",
        "tp_rank: cached=0 requested=1",
        "device_kind: cached=cpu requested=cuda",
        "device_id: cached=host requested=GPU-1",
    ]


def test_diff_names_the_changed_shard_and_attribute():
    cached = make_key(shards=(ShardId("a", 1, "h", "c"), ShardId("b", 2, "h", "c")))
    requested = make_key(shards=(ShardId("a", 1, "h", "CHANGED"), ShardId("c", 2, "h", "c")))
    assert [str(d) for d in cached.diff(requested)] == [
        "shards[b]: cached=present requested=absent",
        "shards[a].content_digest: cached=c requested=CHANGED",
        "shards[c]: cached=absent requested=present",
    ]


def test_a_field_diff_is_data_whose_text_is_the_wire_line_and_round_trips():
    diff = make_key().diff(make_key(dtype="bfloat16"))[0]
    assert (diff.field, diff.cached, diff.requested) == ("dtype", "float16", "bfloat16")
    assert FieldDiff.from_wire(str(diff)) == diff
    shard = FieldDiff("shards[a].content_digest", "c", "x")
    assert FieldDiff.from_wire(str(shard)) == shard
    assert FieldDiff.from_wire("... and 3 more differences") == FieldDiff("... and 3 more differences", "", "")


def test_a_device_is_spelled_one_way():
    assert pool_device("cpu", "host") == make_key().device == "cpu"
    assert pool_device("cuda", "GPU-1") == make_key(device_kind="cuda", device_id="GPU-1").device == "cuda:GPU-1"


def test_model_path_is_display_only_and_data_parallel_is_not_a_field():
    a, b = make_key(model="/srv/a"), make_key(model="/mnt/b")
    assert a == b and a.short == b.short and a.diff(b) == []
    names = {f.name for f in dataclasses.fields(CacheKey)}
    assert not {n for n in names if n.startswith("dp") or "data_parallel" in n}


def test_wire_roundtrip_and_strict_fields():
    key = make_key(tp_size=4, tp_rank=3)
    assert CacheKey.from_wire(key.to_wire()) == key
    wire = key.to_wire()
    wire["dp_rank"] = 0
    with pytest.raises(ValueError, match=r"unknown \['dp_rank'\]"):
        CacheKey.from_wire(wire)
    wire = key.to_wire()
    wire["tp_size"] = "4"
    with pytest.raises(ValueError, match="key.tp_size must be int, got str"):
        CacheKey.from_wire(wire)


@pytest.mark.parametrize("overrides, message", [
    (dict(shards=()), "shards is empty"),
    (dict(tp_size=2, tp_rank=2), "ranks out of range"),
    (dict(device_kind="tpu"), "device_kind must be"),
])
def test_invalid_keys_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_key(**overrides)


def test_short_key_is_stable_and_12_hex():
    assert make_key().short == make_key().short
    assert len(make_key().short) == 12 and int(make_key().short, 16) >= 0
    assert make_key().short != make_key(dtype="bfloat16").short
