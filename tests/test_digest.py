"""Content digests (``loading/digest.py``): a two-level xxh3 tree, cached by file identity; a file
changed in place never keeps its cached digest.

Run: pytest tests/test_digest.py
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import pytest
import xxhash
from conftest import run_cli

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


@contextlib.contextmanager
def tmpfs(path, *, size: str, read_only: bool = False):
    """A small file system of its own at ``path`` (root only: mounting is what a full or read-only disk is)."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.slow  # a hotweights generate process each
@pytest.mark.parametrize("fs", ["full", "read-only"])
def test_an_unusable_digest_cache_costs_hashing_not_the_start(models, socket_dir, tmp_path, fs):
    with tmpfs(tmp_path / "cache", size="64k", read_only=fs == "read-only") as cache:
        if fs == "full":
            with open(cache / "filler", "wb") as f:
                with contextlib.suppress(OSError):
                    f.write(b"\0" * (1 << 20))  # ENOSPC: not a byte left
        r = run_cli("generate", "--model", str(models["small"]), "--max-tokens", "2", "--model-loader-extra-config",
                    json.dumps({"socket_dir": str(socket_dir)}), env={"HOTWEIGHTS_CACHE_DIR": str(cache)})
        left = sorted(p.name for p in cache.iterdir())
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "digest cache" in line and "cannot be written" in line]
    assert len(said) == 1 and str(cache / "digests.json") in said[0], r.stderr
    assert ("No space left on device" if fs == "full" else "Read-only file system") in said[0]
    assert "falling back to disk loading" in r.stderr  # the start went on, by the fallback it asked for
    assert left == (["filler"] if fs == "full" else [])  # no temporary file left behind


def test_a_cache_that_cannot_be_used_is_said_once(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = DigestCache(blocker / "sub" / "digests.json")  # a file where its directory should be
    st = os.stat(blocker)
    with caplog.at_level("WARNING"):
        cache.put(st, "a" * 32)
        cache.put(st, "b" * 32)
    said = [r.message for r in caplog.records if "digest cache" in r.message]
    assert len(said) == 1 and "Not a directory" in said[0], said
    assert cache.get(st) == "b" * 32  # remembered for this process all the same
