"""The KV cache a vLLM preload asks for: the least that vLLM starts with (``--kv-cache-memory-bytes``).

A preload never serves, so its KV cache only has to hold one ``--max-model-len`` sequence, the check vLLM makes at
start. Left to vLLM, its size comes from a memory profile that reads the whole GPU's used memory: whatever another
process allocates meanwhile counts as this engine's own, so two preloads beside each other (each loading 16 GB and
publishing a copy of it, for an 8B) leave each other no KV cache at all and fail. A size given is not profiled, and
neither it nor ``--gpu-memory-utilization`` is in vLLM's compile-cache key (vLLM 0.26 ``CacheConfig.compute_hash``
ignores both): what the preload compiles, the first start still finds. vLLM-free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

from ... import argv
from ...evidence import GIB

KV_BYTES = argv.Option(("--kv-cache-memory-bytes",))
MAX_MODEL_LEN = argv.Option(("--max-model-len",))
MARGIN = 1.25  # over one sequence's KV: blocks are whole, and some layers may keep more than the config says
FLOOR = 256 << 20
CEILING = 4 << 30  # a preload that would need more than this lets vLLM size its KV cache itself


def _human_int(text: str) -> int:
    """vLLM's human-readable integers: 4096, 4k, 4K (1024), 1M, 2G."""
    text = text.strip()
    units = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def kv_given(args: Sequence[str]) -> int | None:
    """The KV cache size per GPU the arguments give (``--kv-cache-memory-bytes``), None where they give none or one
    vLLM will refuse in its own words."""
    try:
        given = KV_BYTES.value(args)
        return _human_int(given) if given else None
    except ValueError:
        return None


def kv_pin(model_dir: str | Path, args: Sequence[str], tp_size: int = 1) -> int | None:
    """Bytes of KV cache per GPU for a preload of ``model_dir`` with vLLM arguments ``args``; None where vLLM should
    size it itself: the arguments give a size already, or the config does not tell it (a layout this estimate does
    not know), or one sequence would need more than ``CEILING``."""
    if KV_BYTES.present(args):
        return None
    try:
        config = json.loads(Path(model_dir, "config.json").read_text())
        text = config.get("text_config") or config
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        given = MAX_MODEL_LEN.value(args)
        tokens = _human_int(given) if given not in (None, "auto", "-1") else int(text["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    element = 4 if "32" in dtype else 2
    per_token = 2 * layers * math.ceil(kv_heads / tp_size) * head_dim * element  # keys and values
    need = max(FLOOR, int(per_token * tokens * MARGIN))
    return need if need <= CEILING else None


_PROFILED_RE = re.compile(r"Available KV cache memory: (\d+(?:\.\d+)?) GiB")


def kv_profiled(log: str) -> int | None:
    """The KV cache per GPU vLLM's memory profile gave a start whose output is ``log`` (vLLM 0.26's GPU worker logs
    ``Available KV cache memory: 21.43 GiB`` once per rank after its profile: the least; none where the KV cache
    was given), in bytes rounded down below what the line's two decimals may have
    rounded up (at most 10 MiB less than vLLM's own: a few blocks); None where no such line is."""
    found = [float(m.group(1)) for m in _PROFILED_RE.finditer(log)]
    return max(0, int((min(found) - 0.005) * GIB)) if found else None
