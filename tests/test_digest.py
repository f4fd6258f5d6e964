"""Content digests (``loading/digest.py``): a two-level xxh3 tree, cached by file identity; a file
changed in place never keeps its cached digest.

Run: pytest tests/test_digest.py
"""

from __future__ import annotations

import os

import xxhash

from hotweights.loading import digest
from hotweights.loading.digest import BLOCK_BYTES, DigestCache, hash_file


def test_the_digest_is_the_hash_of_the_block_hashes(tmp_path):
    data = os.urandom(1000) + b"\0" * BLOCK_BYTES  # two blocks, the second one short
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    blocks = [xxhash.xxh3_128_digest(data[:BLOCK_BYTES]), xxhash.xxh3_128_digest(data[BLOCK_BYTES:])]
    assert hash_file(path) == xxhash.xxh3_128_hexdigest(b"".join(blocks))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert hash_file(empty) == xxhash.xxh3_128_hexdigest(b"")


def test_a_cached_digest_is_read_without_reading_the_file(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"weights")
    cache = DigestCache(tmp_path / "digests.json")
    first = cache.digest(path, os.stat(path))
    monkeypatch.setattr(digest, "hash_file", lambda p: (_ for _ in ()).throw(AssertionError(f"read {p}")))
    assert DigestCache(tmp_path / "digests.json").digest(path, os.stat(path)) == first  # a new process's view


def test_a_file_rewritten_in_place_misses_the_cache_and_is_hashed_again(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"weights-a")
    cache = DigestCache(tmp_path / "digests.json")
    before = cache.digest(path, os.stat(path))
    st = os.stat(path)
    path.write_bytes(b"weights-b")  # same size; mtime restored: ctime still changes
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.get(os.stat(path)) is None
    assert cache.digest(path, os.stat(path)) != before


def test_rehash_reads_the_file_even_when_the_cache_knows_it(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"weights")
    cache = DigestCache(tmp_path / "digests.json")
    st = os.stat(path)
    cache.put(st, "stale")
    assert cache.digest(path, st) == "stale"
    assert cache.digest(path, st, rehash=True) == hash_file(path)


def test_a_corrupt_cache_file_is_an_empty_cache(tmp_path):
    (tmp_path / "digests.json").write_text("{not json")
    path = tmp_path / "f"
    path.write_bytes(b"w")
    assert DigestCache(tmp_path / "digests.json").get(os.stat(path)) is None
