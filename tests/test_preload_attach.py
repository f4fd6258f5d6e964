"""Preload in one process, attach in others: the bytes are exactly a disk load's.

Also: tied weights stay one object, casts are exact, a modified checkpoint never
matches, and an attached engine outlives the daemon.
Run: pytest tests/test_preload_attach.py
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import DaemonProc, run_cli
from safetensors.torch import load_file

from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
from hotweights.loading.preload import preload


def disk_tensors(model_dir, dtype: str) -> dict[str, torch.Tensor]:
    out = {}
    for shard in open_checkpoint(model_dir).shards:
        for name, t in load_file(shard.path).items():
            out[name] = t.to(getattr(torch, dtype)) if t.is_floating_point() else t
    return out


def key_for(model_dir, dtype: str):
    return checkpoint_key(open_checkpoint(model_dir), dtype=dtype)


@pytest.mark.parametrize("size, dtype", [("tiny", "float16"), ("tiny", "bfloat16"), ("tiny", "float32"),
                                         ("small", "float16"), ("small", "bfloat16")])
def test_attach_is_bitwise_equal_to_disk_load(models, daemon, size, dtype):
    result = run_cli("preload", "--model", str(models[size]), "--dtype", dtype, "--json",
                     "--socket-dir", str(daemon.paths.directory))
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stdout)
    assert line["dtype"] == dtype and not line["already_cached"]
    attached = attach_tensors(key_for(models[size], dtype), AttachConfig(socket_dir=str(daemon.paths.directory)))
    assert attached.ok, attached.reason
    expected = disk_tensors(models[size], dtype)
    assert sorted(attached.tensors) == sorted(expected)
    for name, t in expected.items():
        got = attached.tensors[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        assert torch.equal(got.view(torch.uint8), t.view(torch.uint8)), name


def test_preload_prints_publish_line_and_is_idempotent(models, daemon):
    args = ("preload", "--model", str(models["small"]), "--dtype", "float16", "--socket-dir",
            str(daemon.paths.directory))
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("Published 47 tensors (0.01 GiB) to weight cache: small [")
    assert "Published 47 tensors" in daemon.log()
    second = run_cli(*args)
    assert second.returncode == 0 and second.stdout.startswith("Already cached: small [")


@pytest.mark.parametrize("change", ["chmod", "copy"])
def test_preload_of_the_same_bytes_is_already_cached(model_copy, daemon, change):
    """Restart scripts run `preload && serve` every time: the same bytes under the same key
    must succeed, even when the digest cache cannot know the files (new ctime, new inode)."""
    model = model_copy("tiny")
    args = ("--dtype", "float16", "--socket-dir", str(daemon.paths.directory))
    assert run_cli("preload", "--model", str(model), *args).returncode == 0
    if change == "chmod":
        os.chmod(model / "model.safetensors", 0o600)
        again = model
    else:
        again = model.parent / "identical"
        shutil.copytree(model, again)
    second = run_cli("preload", "--model", str(again), *args)
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith(f"Already cached: {again.name} ["), second.stdout


def test_preload_starts_a_detached_daemon(models, socket_dir):
    result = run_cli("preload", "--model", str(models["tiny"]), "--socket-dir", str(socket_dir), "--json")
    assert result.returncode == 0, result.stderr
    status = run_cli("status", "--json", "--socket-dir", str(socket_dir))
    data = json.loads(status.stdout)
    assert [e["key"] for e in data["entries"]] == [json.loads(result.stdout)["key"]]
    assert data["torch_imported"] is False
    assert run_cli("stop", "--socket-dir", str(socket_dir)).returncode == 0
    deadline = time.monotonic() + 5
    while (socket_dir / "daemon.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (socket_dir / "daemon.sock").exists()


def test_miss_and_mismatch_report_fields(models, daemon):
    config = AttachConfig(socket_dir=str(daemon.paths.directory))
    miss = attach_tensors(key_for(models["tiny"], "float16"), config)
    assert miss.outcome == "miss" and "the daemon holds no entries" in miss.reason
    preload(models["tiny"], dtype="float16", socket_dir=str(daemon.paths.directory))
    mismatch = attach_tensors(key_for(models["tiny"], "bfloat16"), config)
    assert mismatch.outcome == "mismatch"
    assert [str(d) for d in mismatch.diffs] == ["dtype: cached=float16 requested=bfloat16"]


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_checkpoint_modified_in_place_never_matches(model_copy, daemon, keep_mtime):
    model = model_copy("tiny")
    preload(model, dtype="float32", socket_dir=str(daemon.paths.directory))
    path = model / "model.safetensors"
    before = os.stat(path)
    with open(path, "r+b") as f:  # zero one weight's first bytes, same size, same header
        shard = open_checkpoint(model).shards[0]
        f.seek(shard.tensors[-1].begin)
        f.write(b"\0" * 8)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # only ctime still tells
    result = attach_tensors(key_for(model, "float32"), AttachConfig(socket_dir=str(daemon.paths.directory)))
    assert result.outcome == "mismatch"
    assert [d.field for d in result.diffs] == ["shards[model.safetensors].content_digest"]


def test_rehash_catches_bytes_changed_through_a_shared_mapping(model_copy, daemon):
    import mmap

    model = model_copy("tiny")
    path = model / "model.safetensors"
    offset = open_checkpoint(model).shards[0].tensors[-1].begin
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED) as m:
        m[offset] = (m[offset] + 1) % 256  # dirties the page: mtime and ctime move now
        preload(model, dtype="float32", socket_dir=str(daemon.paths.directory))
        before = os.stat(path)
        m[offset + 1] = (m[offset + 1] + 1) % 256  # the page is already dirty: no time moves
        m.flush()
        assert (os.stat(path).st_mtime_ns, os.stat(path).st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)
    config = AttachConfig(socket_dir=str(daemon.paths.directory))
    stale = attach_tensors(checkpoint_key(open_checkpoint(model), dtype="float32"), config)
    assert stale.ok  # the documented limit: the digest cache cannot see this change
    fresh = attach_tensors(checkpoint_key(open_checkpoint(model), dtype="float32", rehash=True), config)
    assert fresh.outcome == "mismatch" and fresh.diffs[0].field == "shards[model.safetensors].content_digest"


def test_copy_mode_owns_its_memory(models, daemon):
    preload(models["small"], dtype="float16", socket_dir=str(daemon.paths.directory))
    key = key_for(models["small"], "float16")
    zero = attach_tensors(key, AttachConfig(socket_dir=str(daemon.paths.directory)))
    copy = attach_tensors(key, AttachConfig(socket_dir=str(daemon.paths.directory), mode="copy"))
    assert copy.ok and zero.ok
    name = "model.embed_tokens.weight"
    assert torch.equal(copy.tensors[name], zero.tensors[name])
    assert copy.tensors[name].data_ptr() != zero.tensors[name].data_ptr()


def test_an_entry_attached_again_at_the_addresses_of_one_let_go_is_held_once(models, daemon):
    """The kernel hands a new mapping the range a dropped one left: the dropped entry must not come back to
    life with it, or a park would unmap the new one twice and a wake map it twice."""
    from hotweights.loading import resident

    sock = str(daemon.paths.directory)
    preload(models["small"], dtype="float16", socket_dir=sock)
    key = key_for(models["small"], "float16")
    first = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    del first
    gc.collect()
    again = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    (held,) = [h for h in resident.held() if h.key == key]
    w = again.tensors["model.embed_tokens.weight"]
    expected = w.clone()
    gc.collect()
    assert resident.unmap_all() == held.manifest.nbytes
    assert resident.map_again().source == "host"  # a CPU entry's bytes: the keeper's
    assert torch.equal(w, expected) and [h for h in resident.held() if h.key == key] == [held]


ENGINE = r"""
import sys, json, torch
from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
model, sock_dir, action = sys.argv[1:4]
key = checkpoint_key(open_checkpoint(model), dtype="float16")
r = attach_tensors(key, AttachConfig(socket_dir=sock_dir, fallback=False))
w = r.tensors["model.embed_tokens.weight"]
if action == "write":
    w.fill_(7)
print(json.dumps({"status": r.outcome, "sum": float(w.float().sum())}), flush=True)
sys.stdin.readline()  # wait: the test kills the daemon meanwhile
x = torch.ones(1, w.shape[1], dtype=w.dtype)
print(json.dumps({"sum": float(w.float().sum()), "y": float((x @ w.T).float().sum())}), flush=True)
"""


def start_engine(model, sock_dir, action="read") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ENGINE, str(model), str(sock_dir), action], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_engine_survives_daemon_kill(models, socket_dir):
    d = DaemonProc(socket_dir)
    preload(models["small"], dtype="float16", socket_dir=str(socket_dir))
    engine = start_engine(models["small"], socket_dir)
    first = json.loads(engine.stdout.readline())
    assert first["status"] == "ok"
    os.kill(d.pid, signal.SIGKILL)
    d.proc.wait()
    out, _ = engine.communicate("\n", timeout=60)
    after = json.loads(out)
    expected = disk_tensors(models["small"], "float16")["model.embed_tokens.weight"]
    assert after["sum"] == first["sum"] == float(expected.float().sum())
    assert after["y"] == float((torch.ones(1, expected.shape[1], dtype=expected.dtype) @ expected.T).float().sum())
    d.stop()
    d2 = DaemonProc(socket_dir)  # a new daemon can start on the same directory
    assert "removing stale socket" in d2.log()
    d2.stop()


def test_zero_copy_writes_stay_private_to_the_engine(models, daemon):
    preload(models["small"], dtype="float16", socket_dir=str(daemon.paths.directory))
    writer = start_engine(models["small"], daemon.paths.directory, "write")
    reader = start_engine(models["small"], daemon.paths.directory, "read")
    wrote, read = json.loads(writer.stdout.readline()), json.loads(reader.stdout.readline())
    writer.communicate("\n", timeout=60)
    reader.communicate("\n", timeout=60)
    expected = disk_tensors(models["small"], "float16")["model.embed_tokens.weight"]
    assert wrote["sum"] == 7.0 * expected.numel()
    assert read["sum"] == float(expected.float().sum())


@pytest.mark.parametrize("setup, message", [
    ("missing", "does not exist or is not a directory"),
    ("empty", "no *.safetensors files in"),
    ("corrupt", "header length"),
    ("badjson", "header is not valid JSON"),
    ("baddtype", "unsupported dtype 'C64'"),
])
def test_preload_errors_are_clear(tmp_path, socket_dir, setup, message):
    model = tmp_path / "m"
    if setup != "missing":
        model.mkdir()
    header = {"empty": None, "corrupt": None, "badjson": b"{not json", "baddtype":
              json.dumps({"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()}.get(setup)
    if setup == "corrupt":
        (model / "model.safetensors").write_bytes((10 ** 9).to_bytes(8, "little") + b"{}")
    elif header is not None:
        (model / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    result = run_cli("preload", "--model", str(model), "--socket-dir", str(socket_dir))
    assert result.returncode == 1
    assert message in result.stderr, result.stderr


def test_unsupported_dtype_and_tp_are_refused(models, socket_dir):
    r = run_cli("preload", "--model", str(models["tiny"]), "--dtype", "float8", "--socket-dir", str(socket_dir))
    assert r.returncode == 2 and "invalid choice: 'float8'" in r.stderr
    r = run_cli("preload", "--model", str(models["tiny"]), "--tensor-parallel-size", "2", "--socket-dir",
                str(socket_dir))
    assert r.returncode == 1 and "--tensor-parallel-size 2" in r.stderr


def test_empty_digest_cache_rehashes_and_still_matches(models, daemon, caplog):
    import logging

    from hotweights.paths import digest_cache_path

    preload(models["small"], dtype="float16", socket_dir=str(daemon.paths.directory))
    digest_cache_path().unlink()
    caplog.set_level(logging.INFO, logger="hotweights")
    result = attach_tensors(key_for(models["small"], "float16"), AttachConfig(socket_dir=str(daemon.paths.directory)))
    assert result.ok, result.reason
    assert any(m.startswith("digest cache miss: file=") for m in caplog.messages)


IMPATIENT_DAEMON = """import sys
from pathlib import Path
from hotweights.keeper.limits import Limits
from hotweights.keeper.main import run
from hotweights.keeper.server import DaemonConfig
from hotweights.paths import DaemonPaths
sys.exit(run(DaemonConfig(DaemonPaths(Path(sys.argv[1])), limits=Limits(idle_timeout_s=1.0))))
"""


def test_a_preload_slower_than_the_idle_timeout_still_publishes(models, socket_dir):
    # the daemon closes connections idle for idle_timeout_s (a minute by default, one second here); a read
    # that takes longer (a large checkpoint) must not find its connection closed when it publishes
    proc = subprocess.Popen([sys.executable, "-c", IMPATIENT_DAEMON, str(socket_dir)])
    try:
        deadline = time.monotonic() + 20
        while not (socket_dir / "daemon.sock").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.02)
        slept = []

        def slow_read(done: int, total: int) -> None:
            if len(slept) < 2:  # 2.6 s of reading in all (progress comes per shard: two here)
                slept.append(done)
                time.sleep(1.3)

        result = preload(models["small"], socket_dir=str(socket_dir), progress=slow_read)
        assert not result.already_cached and result.seconds >= 2.5 and len(slept) == 2
        attached = attach_tensors(result.key, AttachConfig(socket_dir=str(socket_dir), fallback=False))
        assert attached.ok, attached.reason
        assert sorted(attached.tensors) == sorted(disk_tensors(models["small"], "bfloat16"))
    finally:
        proc.terminate()
        proc.wait(10)
