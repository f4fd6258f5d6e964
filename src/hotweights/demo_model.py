"""Deterministic Qwen3-architecture checkpoints for demos, tests and benchmarks.

Nothing is downloaded: weights come from a seeded generator (one seed per tensor
name, so a tensor's bytes do not depend on the others), the config from transformers'
``Qwen3Config`` and a byte-level BPE tokenizer (256 byte tokens + ChatML specials)
from ``tokenizers``. transformers and vLLM load the result offline.

Shapes: ``tiny`` (float32, one file, tied embeddings), ``small`` (bfloat16, 2 shards),
``1g`` (bfloat16, about 1 GiB, 4 shards), ``0.6b`` (Qwen3-0.6B-shaped, float16, about
1.2 GB, tied), ``8b`` (Qwen3-8B-shaped, bfloat16, about 16.4 GB) and ``32b`` (Qwen3-32B-shaped,
bfloat16, about 65.5 GB, 14 shards).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, slots=True)
class Shape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    dtype: str
    num_shards: int


SHAPES: dict[str, Shape] = {
    "tiny": Shape(384, 64, 128, 2, 4, 2, 16, True, "float32", 1),
    "small": Shape(384, 256, 768, 4, 8, 4, 32, False, "bfloat16", 2),
    "1g": Shape(384, 2048, 6144, 11, 16, 8, 128, False, "bfloat16", 4),
    "0.6b": Shape(151936, 1024, 3072, 28, 16, 8, 128, True, "float16", 1),
    "8b": Shape(151936, 4096, 12288, 36, 32, 8, 128, False, "bfloat16", 4),
    "32b": Shape(151936, 5120, 25600, 64, 64, 8, 128, False, "bfloat16", 14),
}


def tensor_shapes(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (s.vocab_size, s.hidden_size))]
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (s.hidden_size,)),
            (p + "self_attn.q_proj.weight", (q, s.hidden_size)),
            (p + "self_attn.k_proj.weight", (kv, s.hidden_size)),
            (p + "self_attn.v_proj.weight", (kv, s.hidden_size)),
            (p + "self_attn.o_proj.weight", (s.hidden_size, q)),
            (p + "self_attn.q_norm.weight", (s.head_dim,)),
            (p + "self_attn.k_norm.weight", (s.head_dim,)),
            (p + "post_attention_layernorm.weight", (s.hidden_size,)),
            (p + "mlp.gate_proj.weight", (s.intermediate_size, s.hidden_size)),
            (p + "mlp.up_proj.weight", (s.intermediate_size, s.hidden_size)),
            (p + "mlp.down_proj.weight", (s.hidden_size, s.intermediate_size)),
        ]
    out.append(("model.norm.weight", (s.hidden_size,)))
    if not s.tie_word_embeddings:
        out.append(("lm_head.weight", (s.vocab_size, s.hidden_size)))
    return out


def _make_tensor(name: str, shape: tuple[int, ...], dtype: str, device: str = "cpu", seed: int = 0) -> Any:
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=getattr(torch, dtype))
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1 & 0xFFFFFFFF))
    bound = 1.0 if "embed_tokens" in name else (3.0 / shape[-1]) ** 0.5
    t = torch.empty(shape, dtype=torch.float32, device=device).uniform_(-bound, bound, generator=gen)
    return t.to(getattr(torch, dtype)).cpu()


def write_demo_model(directory: str | Path, size: str = "tiny", *, gen_device: str = "cpu", seed: int = 0,
                     link_shards_from: str | Path | None = None) -> Path:
    """Write the checkpoint, config and tokenizer; returns the directory. ``seed``: another model of the same
    shape with other bytes (0: the default model, as it always was).

    ``gen_device="cuda"`` draws the numbers on the GPU (much faster for ``8b``); the
    bytes are then deterministic per device type, not across them.

    ``link_shards_from``: a demo model of this shape (same file system): every shard but the last is a hard link
    to its file, the last (the final layers, the norm and the untied ``lm_head``) is drawn with ``seed``; so that
    ten 8B models of different answers fit a 64 GiB disk (16.4 GB, then 4.1 GB each). Each is still a model of its
    own to the cache (its own key, its own copy in memory).
    """
    from safetensors.torch import save_file

    if size not in SHAPES:
        raise ValueError(f"unknown demo size {size!r}; choose one of {', '.join(SHAPES)}")
    s = SHAPES[size]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    names = tensor_shapes(s)
    total = sum(_numel(shape) for _, shape in names)
    per_shard = -(-total // s.num_shards)
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    filled = 0
    for name, shape in names:
        if filled >= per_shard and len(groups) < s.num_shards:
            groups.append([])
            filled = 0
        groups[-1].append((name, shape))
        filled += _numel(shape)
    weight_map: dict[str, str] = {}
    if link_shards_from is not None and len(groups) == 1:
        raise ValueError(f"the {size} demo model has one shard: nothing to link (write it whole)")
    for i, group in enumerate(groups):
        fname = "model.safetensors" if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        weight_map.update({n: fname for n, _ in group})
        source = Path(link_shards_from, fname) if link_shards_from is not None and i < len(groups) - 1 else None
        if source is not None and not source.is_file():
            raise ValueError(f"{source} does not exist: link from a {size} demo model written whole")
        (out / fname).unlink(missing_ok=True)  # a link left by an earlier write: never write through it
        if source is not None:
            os.link(source, out / fname)
            continue
        save_file({n: _make_tensor(n, shape, s.dtype, gen_device, seed) for n, shape in group}, out / fname,
                  metadata={"format": "pt"})
        os.chmod(out / fname, 0o666 & ~umask)  # safetensors writes 0600; the other files follow the umask
    if len(groups) > 1:
        itemsize = 4 if s.dtype == "float32" else 2
        index = {"metadata": {"total_size": total * itemsize}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    _write_config(out, s)
    _write_tokenizer(out, s.vocab_size)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _write_config(out: Path, s: Shape) -> None:
    from transformers import Qwen3Config

    config = Qwen3Config(  # type: ignore[call-arg]  # rope_theta: a kwarg transformers 5 reads, unnamed
        vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers, num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim, max_position_embeddings=4096,
        tie_word_embeddings=s.tie_word_embeddings, bos_token_id=256, eos_token_id=258, pad_token_id=256,
        rope_theta=1000000.0,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    data = config.to_dict()
    data["torch_dtype"] = s.dtype
    data["dtype"] = s.dtype
    (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 256, "eos_token_id": 258, "pad_token_id": 256, "do_sample": False}, indent=2))


def _write_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    # every id the model can emit decodes to visible text ("<1234>"), so answers of the
    # large-vocabulary shapes are comparable; text never encodes to these (no merges)
    vocab.update({tok: len(byte_chars) + i for i, tok in enumerate(SPECIAL_TOKENS)})  # ids 256, 257, 258
    first_filler = len(vocab)
    vocab.update({f"<{i}>": i for i in range(first_filler, vocab_size)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
    }, indent=2))


def _byte_of(char: str) -> int:
    # GPT-2 byte-to-unicode: printable bytes map to themselves, the rest to 256 + n
    code = ord(char)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]
