"""Tensors <-> nn.Module: the one walk, ties kept, every problem reported at once.

Run: pytest tests/test_modules.py
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotweights.engines.modules import attach_module, meta_parameters, module_tensors
from hotweights.errors import ManifestError


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight
        self.norm = nn.LayerNorm(4)
        self.register_buffer("scale", torch.ones(1))
        self.register_buffer("cache", torch.arange(3.0), persistent=False)


def build_meta() -> Tied:
    with meta_parameters():
        return Tied()


def test_meta_parameters_build_real_buffers_and_no_parameter_memory():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with meta_parameters():
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             head_dim=16))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())


def test_module_tensors_and_attach_module_round_trip_with_ties():
    source = Tied()
    tensors, aliases, owners = module_tensors(source)
    assert aliases == {"head.weight": "embed.weight"}
    assert set(tensors) == {"embed.weight", "norm.weight", "norm.bias", "scale", "cache"}
    assert owners["head.weight"].owner is source.head and owners["scale"].is_param is False
    model = build_meta()
    attach_module(model, {n: t.clone() for n, t in tensors.items()})
    assert model.head.weight is model.embed.weight  # one Parameter under both names
    assert torch.equal(model.embed.weight, source.embed.weight) and torch.equal(model.scale, source.scale)
    assert not any(p.is_meta for p in model.parameters())


def test_attach_module_reports_every_problem_at_once():
    tensors, _, _ = module_tensors(Tied())
    tensors["norm.weight"] = torch.ones(5)
    del tensors["norm.bias"]
    with pytest.raises(ManifestError) as err:
        attach_module(build_meta(), tensors)
    assert "2 cached tensors do not fit Tied" in str(err.value)
    assert "missing norm.bias" in str(err.value) and "norm.weight: model expects (4,)" in str(err.value)


def test_attach_module_inexact_registers_new_tensors_and_skips_shape_checks():
    tensors, _, _ = module_tensors(Tied())
    tensors["norm.weight"] = torch.ones(2, 4)  # post-processing reshaped it
    tensors["head.weight_scale"] = torch.ones(1)  # post-processing created it
    with torch.device("meta"):
        model = Tied()
    attach_module(model, tensors, exact=False)
    assert model.norm.weight.shape == (2, 4) and model.head.weight_scale.item() == 1.0
    with torch.device("meta"):
        model = Tied()
    del tensors["norm.bias"]
    tensors["nowhere.x"] = torch.ones(1)
    with pytest.raises(ManifestError, match="missing norm.bias.*nowhere.x has no module in this model"):
        attach_module(model, tensors, exact=False)


def test_module_tensors_refuses_meta_and_substitutes():
    with torch.device("meta"):
        model = Tied()
    with pytest.raises(ManifestError, match="still on the meta device"):
        module_tensors(model)
    source = Tied()
    tensors, _, _ = module_tensors(source, substitute=lambda slot, t: t * 0 if slot.leaf == "scale" else t)
    assert tensors["scale"].item() == 0.0 and source.scale.item() == 1.0
