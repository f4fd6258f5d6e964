"""Registry: fd ownership, the budget under one lock, closest-entry diffs. In-process, torch-free.

Run: pytest tests/test_registry.py
"""

from __future__ import annotations

import os

from conftest import open_fds

from hotweights.keeper.registry import Registry
from hotweights.key import CacheKey, ShardId
from hotweights.manifest import Manifest, pack

KEY = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="float16", model="m")
OTHER = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="bfloat16", model="m")


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
    assert [(t, m.key) for t, m in reg.release(KEY.short)] == [("device", KEY)] and reg.lookup(KEY) is None
    assert open_fds() <= before


def test_refusals_close_the_fds_they_were_given():
    before = open_fds()
    reg = Registry()
    assert reg.add(*entry(KEY)) is None
    code, message = reg.add(*entry(KEY))
    assert code == "exists" and "already published" in message
    code, message = reg.add(*entry(OTHER), max_bytes=1500)
    assert code == "budget" and "would exceed the daemon budget of 1500 bytes (1024 bytes in use)" in message
    reg.release(None)
    assert open_fds() <= before


def test_closest_lists_the_differing_fields_and_describe_counts_bytes():
    reg = Registry()
    assert reg.closest(KEY) is None
    reg.add(*entry(OTHER))
    manifest, diffs = reg.closest(KEY)
    assert manifest.key == OTHER and [str(d) for d in diffs] == ["dtype: cached=bfloat16 requested=float16"]
    entries, per_device, parked = reg.describe()
    assert per_device == {"cpu": 1024} and entries[0].key == OTHER.short and entries[0].num_attaches == 0
    assert parked == {}
    reg.release(None)


def sealed(nbytes: int) -> int:
    import fcntl

    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def test_a_host_copy_is_a_tier_of_its_entry_served_only_when_asked_for():
    before = open_fds()
    reg = Registry()
    manifest, fds = entry(KEY)
    assert reg.add(manifest, fds) is None
    assert reg.add(manifest, [sealed(1024)], tier="host") is None
    assert reg.add(manifest, [sealed(1024)], tier="host")[0] == "exists"
    other, other_fds = entry(OTHER)
    assert reg.add(Manifest(KEY, other.pools, other.tensors[:0]), other_fds, tier="host")[0] == "exists"
    (row,), per_device, _ = reg.describe()
    assert (row.nbytes, row.host_nbytes) == (1024, 1024) and per_device == {"cpu": 2048}
    assert [t for t, _ in reg.release(KEY.short, "device")] == ["device"]
    assert reg.lookup(KEY) is None  # an attach of the entry is a miss: the host copy is not the entry
    found, dups = reg.lookup(KEY, "host")
    assert found == manifest
    for fd in dups:
        os.close(fd)
    (row,), _, _ = reg.describe()
    assert (row.nbytes, row.host_nbytes) == (0, 1024)
    assert reg.describe_one(KEY.short) == manifest
    reg.release(None)
    assert reg.describe()[0] == [] and open_fds() <= before


def test_a_host_copy_must_have_the_tensors_of_its_entry():
    reg = Registry()
    manifest, fds = entry(KEY)
    assert reg.add(manifest, fds) is None
    pools, specs = pack([("w", KEY.dtype, (256,))], pool_bytes=1024, device="cpu")
    code, message = reg.add(Manifest(KEY, pools, specs), [sealed(512)], tier="host")
    assert code == "bad_manifest" and "must have the tensors and pools of its other tier" in message
    reg.release(None)


def test_parked_engines_are_listed_per_entry_and_gone_pids_dropped():
    import subprocess

    reg = Registry()
    assert reg.add(*entry(KEY)) is None
    gone = subprocess.Popen(["true"])
    gone.wait()
    reg.park(KEY, os.getpid(), 2, 4096)
    reg.park(KEY, gone.pid, 1, 100)
    (row,), _, parked = reg.describe()
    assert row.parked == f"{os.getpid()}:2" and parked == {"cpu": 4096} and row.parked_bytes == 4096
    reg.park(KEY, os.getpid(), 0, 0)
    (row,), _, parked = reg.describe()
    assert row.parked == "" and parked == {"cpu": 0} and row.parked_bytes == 0
    reg.release(None)


def test_a_vllm_start_counts_only_the_engines_parked_on_the_entry_it_maps():
    from hotweights.engines.vllm.budget import parked_on_entry

    other = CacheKey(shards=(ShardId("n", 1, "h2", "c"),), arch="A", dtype="float16", model="n")
    reg = Registry()
    assert reg.add(*entry(KEY)) is None and reg.add(*entry(other)) is None
    reg.park(KEY, os.getpid(), 1, 1 << 30)  # its own predecessor, parked: the same share
    reg.park(other, os.getpid(), 2, 7 << 30)  # another model's engine: a share of its own
    rows, _, parked = reg.describe()
    assert parked == {"cpu": 8 << 30}
    assert parked_on_entry(rows, KEY.short) == 1 << 30 and parked_on_entry(rows, other.short) == 7 << 30
    assert parked_on_entry(rows, "000000000000") == 0
    reg.release(None)
