"""CUDA VMM pools on a real GPU: zero-copy and copy attach, read-only mapping, survive daemon death.

Skipped without a GPU. Run on the GPU machine: PYTHONPATH=src pytest -m cuda tests/test_pools_cuda.py
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import DaemonProc, run_cli

from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
from hotweights.manifest import PoolSpec
from hotweights.pools.devices import gpu_uuid, resolve_device

pytestmark = pytest.mark.cuda


def disk_gpu(model_dir, dtype: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for shard in open_checkpoint(model_dir).shards:
        for name, t in load_file(shard.path, device="cuda:0").items():
            out[name] = t.to(getattr(torch, dtype)) if t.is_floating_point() else t
    return out


def gpu_key(model_dir, dtype: str):
    dev = resolve_device("cuda:0")
    return checkpoint_key(open_checkpoint(model_dir), dtype=dtype, device=dev)


def test_pool_roundtrip_through_an_fd_is_exact():
    from hotweights.pools import cuda

    device = f"cuda:{gpu_uuid(0)}"
    nbytes = 3 << 20
    pool = cuda.create(nbytes, device)
    data = torch.arange(nbytes, dtype=torch.int64, device="cuda:0").to(torch.uint8)
    pool.as_tensor().copy_(data)
    fd = pool.export()
    spare = os.dup(fd)
    view = cuda.import_pool(fd, PoolSpec(nbytes, device))
    again = cuda.import_pool(spare, PoolSpec(nbytes, device))  # a second import of the same memory
    assert torch.equal(view, data) and torch.equal(again, data)
    assert again.data_ptr() != view.data_ptr()
    del view
    torch.cuda.synchronize()
    assert torch.equal(again, data)  # one mapping going does not take the memory away


WRITER = r"""
import torch
from hotweights.manifest import PoolSpec
from hotweights.pools import cuda
from hotweights.pools.devices import gpu_uuid
device = f"cuda:{gpu_uuid(0)}"
pool = cuda.create(1 << 21, device)
view = cuda.import_pool(pool.export(), PoolSpec(1 << 21, device))
view.fill_(1)
torch.cuda.synchronize()
print("WRITE-SUCCEEDED")
"""


def test_zero_copy_mapping_refuses_writes():
    r = subprocess.run([sys.executable, "-c", WRITER], capture_output=True, text=True, timeout=120)
    assert "WRITE-SUCCEEDED" not in r.stdout and r.returncode != 0
    assert "illegal" in r.stderr.lower() or "error" in r.stderr.lower(), r.stderr[-2000:]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_preload_then_attach_is_bitwise_equal(models, daemon, dtype):
    sock = str(daemon.paths.directory)
    r = run_cli("preload", "--model", str(models["small"]), "--device", "cuda", "--dtype", dtype, "--json",
                "--socket-dir", sock)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["device"] == f"cuda:{gpu_uuid(0)}"
    expected = disk_gpu(models["small"], dtype)
    for mode in ("zero_copy", "copy"):
        got = attach_tensors(gpu_key(models["small"], dtype), AttachConfig(socket_dir=sock, mode=mode))
        assert got.ok, got.reason
        for name, t in expected.items():
            assert got.tensors[name].device.type == "cuda" and torch.equal(got.tensors[name], t), (mode, name)


ENGINE = r"""
import sys, json, torch
from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
from hotweights.pools.devices import resolve_device
model, sock = sys.argv[1:3]
key = checkpoint_key(open_checkpoint(model), dtype="float16", device=resolve_device("cuda:0"))
r = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
w = r.tensors["model.layers.0.mlp.up_proj.weight"]
x = torch.ones(4, w.shape[1], dtype=w.dtype, device="cuda:0")
print(json.dumps({"status": r.outcome, "y": float((x @ w.T).float().sum())}), flush=True)
sys.stdin.readline()
print(json.dumps({"y": float((x @ w.T).float().sum())}), flush=True)
"""


def test_gpu_engine_survives_daemon_kill(models, socket_dir):
    d = DaemonProc(socket_dir)
    assert run_cli("preload", "--model", str(models["small"]), "--device", "cuda", "--dtype", "float16",
                   "--socket-dir", str(socket_dir)).returncode == 0
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(models["small"]), str(socket_dir)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    first = json.loads(engine.stdout.readline())
    assert first["status"] == "ok"
    os.kill(d.pid, signal.SIGKILL)
    d.proc.wait()
    out, _ = engine.communicate("\n", timeout=120)
    assert json.loads(out)["y"] == first["y"]
    d.stop()


def test_gpu_transformers_answers_match_disk(models, daemon):
    from hotweights.engines.transformers import load_model

    sock = str(daemon.paths.directory)
    assert run_cli("preload", "--model", str(models["tiny"]), "--device", "cuda", "--dtype", "float16",
                   "--socket-dir", sock).returncode == 0
    warm, report = load_model(models["tiny"], dtype="float16", device="cuda:0",
                              config={"socket_dir": sock, "fallback": False})
    disk, _ = load_model(models["tiny"], dtype="float16", device="cuda:0", load_format="auto")
    assert report.source == "cache" and warm.lm_head.weight is warm.model.embed_tokens.weight
    ids = torch.tensor([[72, 101, 108, 108, 111]], device="cuda:0")
    with torch.inference_mode():
        a = warm.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=256)
        b = disk.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=256)
    assert torch.equal(a, b)


def test_a_deep_park_unmaps_and_maps_again_at_the_same_addresses_under_a_cuda_graph(models, daemon):
    """A CUDA graph captured over zero-copy weights replays the same after the weights were unmapped and
    mapped again: from the keeper's GPU entry, then from its host copy (the entry released), published back."""
    from hotweights.client import connect
    from hotweights.loading import resident, tiers

    gc.collect()  # the entries earlier tests mapped in this process (a model's reference cycles) let go of
    assert resident.mapped_bytes() == 0, [h.key.short for h in resident.held()]
    sock = str(daemon.paths.directory)
    assert run_cli("preload", "--model", str(models["small"]), "--device", "cuda", "--dtype", "float16",
                   "--socket-dir", sock).returncode == 0
    key = gpu_key(models["small"], "float16")
    got = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    assert got.ok, got.reason
    w = got.tensors["model.layers.0.mlp.up_proj.weight"]
    x = torch.ones(4, w.shape[1], dtype=w.dtype, device="cuda:0")
    graph, out = torch.cuda.CUDAGraph(), None
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x @ w.T  # warm-up on a side stream, as graph capture wants
        with torch.cuda.graph(graph):
            out = x @ w.T
    graph.replay()
    expected = out.clone()
    ptr = w.data_ptr()
    held = next(h for h in resident.held() if h.key == key)
    assert resident.unmap_all() == held.manifest.nbytes and not held.mapped
    assert resident.map_again().source == "gpu" and w.data_ptr() == ptr
    out.zero_()
    graph.replay()
    assert torch.equal(out, expected)
    with connect(daemon.paths) as client:
        assert tiers.host_copy(client) == held.manifest.nbytes
        assert resident.unmap_all() > 0
        held.pinning.join()  # the host copy pinned for the wake, while parked: one DMA
        assert held.pinned and sum(p.nbytes for p in held.pinned) == held.manifest.nbytes
        client.release(key.short, tier="device")
        (row,) = client.status().rows()
        assert row.nbytes == 0 and row.host_nbytes == held.manifest.nbytes
        again = resident.map_again()
        assert again.source == "host" and again.host_bytes == held.manifest.nbytes and "GB/s" in again.rate()
        assert held.pinned  # kept (the next test)
        (row,) = client.status().rows()
        assert row.nbytes == row.host_nbytes  # the wake published the entry back
    out.zero_()
    graph.replay()
    assert torch.equal(out, expected) and w.data_ptr() == ptr
    # filled in place at the old address, and what it published is what the next engine maps
    again = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    assert again.ok and torch.equal(again.tensors["model.layers.0.mlp.up_proj.weight"], w)


def test_a_pinned_host_copy_stays_pinned_across_wakes_until_the_keeper_has_another(models, daemon):
    """Letting go of 16 GiB of pinned pages while vLLM woke held its wake back, and the next deep park pins
    them again: the pinning stays while the keeper's host copy is the same file, and goes once it is not."""
    from hotweights.client import connect
    from hotweights.loading import resident, tiers

    gc.collect()
    sock = str(daemon.paths.directory)
    assert run_cli("preload", "--model", str(models["small"]), "--device", "cuda", "--dtype", "float16",
                   "--socket-dir", sock).returncode == 0
    key = gpu_key(models["small"], "float16")
    got = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False))
    w = got.tensors["model.layers.0.mlp.up_proj.weight"]
    expected = w.clone()
    (held,) = [h for h in resident.held() if h.key == key]
    with connect(daemon.paths) as client:
        assert tiers.host_copy(client) == held.manifest.nbytes
        pinned = None
        for _ in range(2):  # two deep parks and wakes from the host copy: one pinning
            assert resident.unmap_all() > 0
            held.pinning.join()
            assert held.pinned and (pinned is None or held.pinned is pinned)
            pinned = held.pinned
            client.release(key.short, tier="device")
            assert resident.map_again().source == "host" and held.pinned is pinned
            assert torch.equal(w, expected)
        client.release(key.short, tier="host")  # the keeper's host copy made anew: the next park pins it
        assert tiers.host_copy(client) == held.manifest.nbytes
        assert resident.unmap_all() > 0
        held.pinning.join()
        assert held.pinned and held.pinned is not pinned
        for _ in range(100):  # the old one let go of, in a thread of its own
            if all(p.host is None for p in pinned):
                break
            time.sleep(0.05)
        assert all(p.host is None for p in pinned)
        assert resident.map_again().source == "gpu" and torch.equal(w, expected)


def test_a_wake_from_the_host_copy_uploads_every_byte_in_place_through_several_workers():
    """The host-copy wake's upload (several workers, pinned stages, warmed ahead), from the memfd (preadv, the
    wake's) and from a mapping of it: a pool of an odd size lands bitwise; a shorter fd is an error."""
    from hotweights.loading import upload
    from hotweights.pools import cpu, cuda

    upload.warm_stages(0, threads=8)

    nbytes = 5 * upload.STAGE_BYTES + 12345 * 4096
    made = cpu.create(nbytes)
    made.as_tensor().copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8))
    fd = made.export()
    host = cpu.import_pool(os.dup(fd), PoolSpec(nbytes, "cpu"))
    for threads, src in ((1, fd), (3, fd), (8, fd), (3, host)):
        pool = cuda.create(nbytes, resolve_device("cuda:0").pool_device)
        dst = pool.as_tensor()
        upload.upload(src, dst, threads=threads)
        assert torch.equal(dst.cpu(), host), (threads, type(src))
        del dst
        pool.close()
    short = cpu.create(nbytes - upload.STAGE_BYTES)
    pool = cuda.create(nbytes, resolve_device("cuda:0").pool_device)
    short_fd = short.export()
    with pytest.raises(OSError, match="more were expected"):
        upload.upload(short_fd, pool.as_tensor(), threads=3)
    pool.close()
    os.close(fd)
    os.close(short_fd)
