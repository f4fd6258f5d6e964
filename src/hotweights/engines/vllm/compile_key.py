"""A model's factor in vLLM's compile-cache key: what its config files say, not where they are.

vLLM keys its compile cache (``VLLM_CACHE_ROOT/torch_compile_cache``, AOT artifacts included) by a hash of its
config, in which the model's directory stands for the architecture and shapes (vLLM reads those from the
directory's ``config.json``; no other factor holds them). Ten fine-tunes of one base, or ten demo models, then
compiled ten times. ``config_digest`` is that factor from the files themselves: a SHA-256 over the directory's
top-level JSON files that describe the model (``config.json``, a separate quantization or ``params.json``), with the
keys that name rather than shape it dropped (``_name_or_path``, ``transformers_version``). Files that do not change
the computation (tokenizer, generation defaults, the shard index) are left out. A directory without a
``config.json`` (a hub name, a GGUF file) keeps its path as the factor. vLLM-free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

NOT_THE_MODEL = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "generation_config", "preprocessor",
                 "processor", "chat_template")
NAMING_KEYS = ("_name_or_path", "transformers_version")


def config_digest(model: str) -> str | None:
    """``config-sha256:<hex>`` for the model directory ``model``; None where it has no ``config.json`` or a file
    of it cannot be read as JSON (vLLM's own key is kept)."""
    directory = Path(model)
    if not (directory / "config.json").is_file():
        return None
    described: dict[str, object] = {}
    try:
        for path in sorted(directory.glob("*.json")):
            name = path.name
            if name.startswith(NOT_THE_MODEL) or name.endswith(".index.json"):
                continue
            content = json.loads(path.read_text())
            if isinstance(content, dict):
                content = {k: v for k, v in content.items() if k not in NAMING_KEYS}
            described[name] = content
    except (OSError, ValueError):
        return None
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return "config-sha256:" + hashlib.sha256(text.encode()).hexdigest()
