"""The zero-copy write guard and buffer ownership (vLLM-free; CPU tensors stand in for a pool).

Run: pytest tests/test_vllm_writes.py
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotweights.engines.writes import WriteGuard, ZeroCopyWrite, own_buffers, storages


def pool_views():
    pool = torch.arange(64, dtype=torch.float32)
    return pool, {"w": pool[:32].view(4, 8), "scale": pool[32:33]}


def test_guard_refuses_in_place_writes_into_the_pool_and_lets_others_through():
    pool, views = pool_views()
    before = pool.clone()
    own = torch.zeros(4, 8)
    with WriteGuard(storages(views.values())):
        for write in (lambda: views["scale"].fill_(1.0), lambda: views["w"].copy_(own),
                      lambda: torch.add(own, own, out=views["w"]), lambda: views["w"].mul_(2)):
            with pytest.raises(ZeroCopyWrite, match="would write into a zero-copy weight of shape"):
                write()
        own.add_(views["w"])  # reading the pool and writing elsewhere is fine
        out = views["w"] @ views["w"].T
    assert torch.equal(pool, before) and torch.equal(own, before[:32].view(4, 8)) and out.shape == (4, 4)


def test_own_buffers_clones_only_pool_buffers_and_keeps_ties():
    pool, views = pool_views()
    a, b = nn.Module(), nn.Module()
    a.register_buffer("_k_scale", views["scale"])
    b.register_buffer("_k_scale", views["scale"])  # one tensor under two modules
    a.register_buffer("own", torch.ones(2))
    a.weight = nn.Parameter(views["w"], requires_grad=False)
    root = nn.Sequential(a, b)
    assert own_buffers(root, storages(views.values())) == 1
    assert a._k_scale is b._k_scale and a._k_scale.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr()
    a._k_scale.fill_(1.0)  # the engine's own copy now
    assert pool[32].item() == 32.0
    assert a.weight.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()  # parameters stay mapped
