"""The pool writer, pool by pool: write-through of an engine's own tensors (the vLLM
engine layout uses it), against a real daemon. Preload (all at once) is in
test_preload_attach.py."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from hotweights.client import connect, connect_for
from hotweights.config import AttachConfig
from hotweights.errors import ManifestError
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
from hotweights.loading.publish import dense_order, publish_tensors
from hotweights.pools.devices import Device

CPU = Device("cpu", "host", -1)


def engine_like_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "layers.0.qkv.weight": torch.randn(96, 32, generator=g, dtype=torch.bfloat16),
        "layers.0.o.weight_t": torch.randn(32, 48, generator=g).t(),  # transposed (non-contiguous) fp32
        "layers.0.scale": torch.tensor([0.5], dtype=torch.float32),
        "rotary.cos_sin_cache": torch.randn(64, 16, generator=g),
        "layers.0.empty": torch.empty(0, dtype=torch.bfloat16),  # a weight the CPU packing emptied
        "embed.weight": torch.randn(50, 32, generator=g, dtype=torch.bfloat16),
    }


def entry_nbytes(key, config: AttachConfig) -> int:
    with connect_for(config) as client:
        return client.entry_nbytes(key)


def key_for(model_dir, layout: str = "vllm/test"):
    return checkpoint_key(open_checkpoint(model_dir), dtype="float32", layout=layout)


def test_dense_order_finds_the_memory_order():
    t = torch.empty(4, 5, 6).permute(2, 0, 1)
    order = dense_order(t)
    assert order is not None and t.permute(order).is_contiguous()
    assert dense_order(torch.empty(4, 6)[:, ::2]) is None  # gappy: no dense order


def test_publish_repoints_chunk_by_chunk_and_a_fresh_attach_gets_the_same_tensors(models, daemon):
    config = AttachConfig(socket_dir=str(daemon.paths.directory), fallback=False)
    originals = engine_like_tensors()
    expected = {n: t.clone() for n, t in originals.items()}
    strides = {n: t.stride() for n, t in originals.items()}
    alive = {n: weakref.ref(t) for n, t in originals.items()}
    engine: dict[str, torch.Tensor] = dict(originals)  # the "engine's" references, repointed below
    del originals
    repointed: list[str] = []

    def repoint(name: str, view: torch.Tensor) -> None:
        engine[name] = view
        repointed.append(name)
        if name in alive:  # freed right away, before the next pool is written
            assert alive[name]() is None, f"{name} outlived its repoint"

    tensors = dict(engine)
    key = key_for(models["tiny"])
    # tiny chunks: every tensor gets its own pool, so originals must go pool by pool
    result = publish_tensors(tensors, key, config, device=CPU, aliases={"lm_head.weight": "embed.weight"},
                             repoint=repoint, pool_bytes=256)
    assert result.accepted and not tensors  # consumed
    assert len(result.manifest.pools) == 5  # the 4-byte scale and the empty tensor share one pool
    assert sorted(repointed) == sorted([*expected, "lm_head.weight"])
    gc.collect()
    assert [n for n, ref in alive.items() if ref() is not None] == []  # no original kept alive
    assert engine["lm_head.weight"] is engine["embed.weight"]
    for name, want in expected.items():
        assert engine[name].stride() == strides[name] and torch.equal(engine[name], want), name

    fresh = attach_tensors(key, config)
    assert fresh.ok and fresh.manifest.aliases == {"lm_head.weight": "embed.weight"}
    for name, want in expected.items():
        got = fresh.tensors[name]
        assert got.dtype == want.dtype and got.stride() == strides[name] and torch.equal(got, want), name
    assert entry_nbytes(key, config) == fresh.manifest.nbytes > 0
    assert entry_nbytes(key_for(models["tiny"], layout="vllm/other"), config) == 0


def test_publish_refused_keeps_the_engine_running_on_its_views(models, daemon):
    config = AttachConfig(socket_dir=str(daemon.paths.directory))
    key = key_for(models["tiny"])
    assert publish_tensors(engine_like_tensors(), key, config, device=CPU).accepted
    again = publish_tensors(engine_like_tensors(), key, config, device=CPU)  # exists: refused, still usable
    assert not again.accepted and torch.equal(again.views["embed.weight"], engine_like_tensors()["embed.weight"])
    with connect(daemon.paths) as client:
        assert [e["num_tensors"] for e in client.status().entries] == [6]  # the first entry, unchanged
    with pytest.raises(ManifestError, match="complex64"):
        publish_tensors({"x": torch.zeros(2, dtype=torch.complex64)}, key_for(models["tiny"], "vllm/c"), config,
                        device=CPU)


@pytest.mark.cuda
def test_publish_on_the_gpu_repoints_to_the_published_pools(models, daemon):
    """What vLLM's write-through does on a GPU: tensors on cuda -> VMM pools -> read-only views."""
    from hotweights.pools.devices import resolve_device

    dev = resolve_device("cuda:0")
    config = AttachConfig(socket_dir=str(daemon.paths.directory), fallback=False)
    tensors = {n: t.to(dev.torch_device) for n, t in engine_like_tensors().items()}
    expected = {n: t.clone() for n, t in tensors.items()}
    strides = {n: t.stride() for n, t in tensors.items()}
    engine = dict(tensors)

    def repoint(name: str, view: torch.Tensor) -> None:
        engine[name] = view

    key = checkpoint_key(open_checkpoint(models["tiny"]), dtype="float32", device=dev,
                         layout="vllm/test")
    assert publish_tensors(tensors, key, config, device=dev, repoint=repoint, pool_bytes=4096).accepted
    for name, want in expected.items():
        assert engine[name].is_cuda and engine[name].stride() == strides[name] and torch.equal(engine[name], want)
    fresh = attach_tensors(key, config)
    assert fresh.ok and all(torch.equal(fresh.tensors[n], w) for n, w in expected.items())
    assert entry_nbytes(key, config) == fresh.manifest.nbytes


@pytest.mark.cuda
def test_the_gpu_originals_go_back_to_the_driver_as_their_pools_are_sealed(models, daemon):
    """A loader-alone vLLM preload held two copies of an 8B to its end: the originals the pools replaced stayed in
    torch's allocator cache beside the pools. Given back as each pool is sealed, the peak is one copy and one pool,
    and more preloads fit beside each other."""
    from hotweights.pools.devices import resolve_device

    dev = resolve_device("cuda:0")
    config = AttachConfig(socket_dir=str(daemon.paths.directory), fallback=False)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(dev.index)
    tensors = {f"layer{i}.weight": torch.ones(16 << 20, dtype=torch.float32, device=dev.torch_device) for i in range(4)}
    engine = dict(tensors)

    def repoint(name: str, view: torch.Tensor) -> None:
        engine[name] = view

    key = checkpoint_key(open_checkpoint(models["tiny"]), dtype="float32", device=dev, layout="vllm/released")
    assert torch.cuda.memory_reserved(dev.index) - before >= 256 << 20  # four originals of 64 MiB
    assert publish_tensors(tensors, key, config, device=dev, repoint=repoint, pool_bytes=64 << 20).accepted
    assert torch.cuda.memory_reserved(dev.index) - before < 64 << 20  # the originals back to the driver
    assert all(torch.equal(v, torch.ones_like(v)) for v in engine.values())
