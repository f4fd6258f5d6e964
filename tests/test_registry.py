"""Registry: fd ownership, the budget under one lock, closest-entry diffs. In-process, torch-free.

Run: pytest tests/test_registry.py
"""

from __future__ import annotations

import os

from hotweights.keeper.registry import Registry
from hotweights.key import CacheKey, ShardId
from hotweights.manifest import Manifest, pack

KEY = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="float16", model="m")
OTHER = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="bfloat16", model="m")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def entry(key: CacheKey) -> tuple[Manifest, list[int]]:
    pools, specs = pack([("w", key.dtype, (512,))], pool_bytes=1024, device="cpu")
    return Manifest(key, pools, specs), [os.memfd_create("t")]


def test_add_lookup_release_own_exactly_one_fd_per_pool():
    before = open_fds()
    reg = Registry()
    assert reg.add(*entry(KEY)) is None
    manifest, dups = reg.lookup(KEY)
    assert manifest.key == KEY and len(dups) == 1
    os.close(dups[0])
    assert reg.lookup(OTHER) is None
    assert [m.key for m in reg.release(KEY.short)] == [KEY] and reg.lookup(KEY) is None
    assert open_fds() == before


def test_refusals_close_the_fds_they_were_given():
    before = open_fds()
    reg = Registry()
    assert reg.add(*entry(KEY)) is None
    code, message = reg.add(*entry(KEY))
    assert code == "exists" and "already published" in message
    code, message = reg.add(*entry(OTHER), max_bytes=1500)
    assert code == "budget" and "would exceed the daemon budget of 1500 bytes (1024 bytes in use)" in message
    reg.release(None)
    assert open_fds() == before


def test_closest_lists_the_differing_fields_and_describe_counts_bytes():
    reg = Registry()
    assert reg.closest(KEY) is None
    reg.add(*entry(OTHER))
    manifest, diffs = reg.closest(KEY)
    assert manifest.key == OTHER and [str(d) for d in diffs] == ["dtype: cached=bfloat16 requested=float16"]
    entries, per_device = reg.describe()
    assert per_device == {"cpu": 1024} and entries[0].key == OTHER.short and entries[0].num_attaches == 0
    reg.release(None)
