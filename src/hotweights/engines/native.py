"""A decoder of the Llama family in plain torch, for the embedded server's fast start.

Why: importing transformers' model machinery costs more than all the rest of a warm restart
(``benchmarks/serve_restart.py`` times the phases). Serving needs one forward with a KV
cache, which is this module: the architectures ``llama``, ``mistral``, ``qwen2`` and
``qwen3`` with plain rotary embeddings and SiLU MLPs. It computes as transformers' sdpa
path does (RMSNorm in float32, rotary angles in float32 cast to the model dtype, SDPA
with the same scale) and names its parameters as the checkpoint does, so
``attach_module`` fills it unchanged, ties included.

``reason_unsupported(config)`` says why a config needs transformers instead (rope
scaling, sliding windows, quantization, another architecture); the server then uses
transformers, logged. Only the last position's logits are computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
KV = tuple[torch.Tensor, torch.Tensor]  # one layer's keys and values
KVCache = list[KV]


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_dict(cls, c: dict[str, Any]) -> DecoderConfig:
        """The decoder config of an HF ``config.json``; ValueError when ``reason_unsupported`` says so."""
        reason = reason_unsupported(c)
        if reason:
            raise ValueError(reason)
        kind = c["model_type"]
        heads = int(c["num_attention_heads"])
        rope = c.get("rope_parameters") or {}
        bias = bool(c.get("attention_bias", False))
        return cls(
            model_type=kind, vocab_size=int(c["vocab_size"]), hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]), num_layers=int(c["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
            qkv_bias=True if kind == "qwen2" else bias, o_bias=bias if kind in ("llama", "qwen3") else False,
            mlp_bias=bool(c.get("mlp_bias", False)) if kind == "llama" else False, qk_norm=kind == "qwen3",
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)))


def reason_unsupported(c: dict[str, Any]) -> str | None:
    """None when this module computes the model of ``config.json`` ``c`` as transformers would."""
    kind = c.get("model_type")
    if kind not in ARCHITECTURES:
        return f"model_type {kind!r} is not one of {', '.join(ARCHITECTURES)}"
    for rope in (c.get("rope_parameters") or {}, c.get("rope_scaling") or {}):  # new and old spellings
        kind_of_rope = rope.get("rope_type", rope.get("type", "default"))
        if kind_of_rope != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
            return f"rope scaling {kind_of_rope!r}"
    if c.get("hidden_act", "silu") != "silu":
        return f"hidden_act {c.get('hidden_act')!r}"
    if c.get("quantization_config"):
        return "a quantized checkpoint"
    if c.get("use_sliding_window") or (kind == "mistral" and c.get("sliding_window")):
        return "sliding-window attention"
    if any(t != "full_attention" for t in c.get("layer_types") or ()):
        return "layers other than full attention"
    return None


def meta(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    """A parameter slot of this shape and dtype, on the meta device and never initialised
    (torch's init functions on meta tensors import the compiler stack: seconds)."""
    return nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)


class Linear(nn.Module):
    def __init__(self, n_in: int, n_out: int, *, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = meta(n_out, n_in, dtype=dtype)
        self.bias = meta(n_out, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = meta(n, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig, dtype: torch.dtype) -> None:
        super().__init__()
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.q_proj = Linear(c.hidden_size, q, bias=c.qkv_bias, dtype=dtype)
        self.k_proj = Linear(c.hidden_size, kv, bias=c.qkv_bias, dtype=dtype)
        self.v_proj = Linear(c.hidden_size, kv, bias=c.qkv_bias, dtype=dtype)
        self.o_proj = Linear(q, c.hidden_size, bias=c.o_bias, dtype=dtype)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype)
        self.head_dim, self.groups, self.qk_norm = c.head_dim, c.num_heads // c.num_kv_heads, c.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: KV | None) -> tuple[torch.Tensor, KV]:
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat((past[0], k), dim=-2), torch.cat((past[1], v), dim=-2)
        kk, vv = (k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)) \
            if self.groups > 1 else (k, v)
        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=q.shape[2] > 1, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, c: DecoderConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias, dtype=dtype)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias, dtype=dtype)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DecoderConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.self_attn = Attention(c, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.mlp = MLP(c, dtype)

    def forward(self, x, cos, sin, past):
        attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class Embedding(nn.Module):
    def __init__(self, n: int, dim: int, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = meta(n, dim, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class Body(nn.Module):
    def __init__(self, c: DecoderConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(Layer(c, dtype) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)


class Decoder(nn.Module):
    """``step(ids, past) -> (last position's logits [vocab], past)``; parameters named as in the checkpoint."""

    def __init__(self, c: DecoderConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = c
        self.model = Body(c, dtype)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, bias=False, dtype=dtype)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # rotary inverse frequencies, as transformers computes them (float32, on the CPU first)
        steps = torch.arange(0, c.head_dim, 2, dtype=torch.int64, device="cpu").float()
        self.inv_freq = 1.0 / (c.rope_theta ** (steps / c.head_dim))

    @classmethod
    def on_meta(cls, config: dict[str, Any], dtype: torch.dtype) -> Decoder:
        """The decoder with every parameter on the meta device: no memory, no init."""
        return cls(DecoderConfig.from_dict(config), dtype)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def rotary(self, start: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.device
        if self.inv_freq.device != device:
            self.inv_freq = self.inv_freq.to(device)
        positions = torch.arange(start, start + n, device=device, dtype=torch.float32)
        freqs = (self.inv_freq[None, :, None] @ positions[None, None, :]).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    def warm_up(self) -> None:
        """One token through the embedding, the first layer, the norm and the head: every kernel
        of the forward runs once (the layers share their shapes), at a fraction of a forward's cost."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        x = self.model.embed_tokens(ids)
        cos, sin = self.rotary(0, 1, x.dtype)
        x, _ = self.model.layers[0](x, cos, sin, None)
        self.lm_head(self.model.norm(x))

    def step(self, ids: torch.Tensor, past: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        x = self.model.embed_tokens(ids)
        cos, sin = self.rotary(0 if past is None else past[0][0].shape[2], ids.shape[1], x.dtype)
        cache: KVCache = []
        for i, layer in enumerate(self.model.layers):
            x, kv = layer(x, cos, sin, None if past is None else past[i])
            cache.append(kv)
        return self.lm_head(self.model.norm(x[:, -1:]))[0, -1], cache
