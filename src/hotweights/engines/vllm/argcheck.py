"""``python -m hotweights.engines.vllm.argcheck``: a switch's vLLM models checked with vLLM's own argument parser,
before any engine starts (issue 68: ``--max-modl-len`` passed the front's config check and failed only at the
start, and demo models whose heads vLLM's CPU build cannot serve reported ready and then failed every request).

Reads ``[{"name": ..., "args": [...], "checkpoint": DIR}, ...]`` (JSON) on stdin, prints ``{name: problem}`` (JSON,
one line, the models with none left out). vLLM's parser and its CPU attention backend import without CUDA: about 5
s on this 2-core machine, once for every model. A model's own arguments only: those the front sets itself
(``--port``, ``--served-model-name``, ...) are refused by the config before this runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from ...argv import refused

PARSERS = ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args")  # 0.26, 0.32


def parser() -> argparse.ArgumentParser:
    """``vllm serve``'s parser (its API server's flags and the engine's)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in PARSERS:
        with contextlib.suppress(ImportError):
            made: argparse.ArgumentParser = importlib.import_module(name).make_arg_parser(FlexibleArgumentParser())
            return made
    raise ImportError(f"none of {', '.join(PARSERS)} in this vLLM")


def head_problem(checkpoint: Path, supported: list[int]) -> str:
    """Where vLLM's CPU build cannot serve the model's attention heads: it starts, reports ready, and fails every
    request."""
    config: dict[str, Any] = json.loads((checkpoint / "config.json").read_text())
    heads = config.get("num_attention_heads")
    head = config.get("head_dim") or (config.get("hidden_size", 0) // heads if heads else None)
    if not isinstance(head, int) or head in supported:
        return ""
    return (f"its attention head size {head} is not one vLLM's CPU build serves ({', '.join(map(str, supported))}): "
            "it would start and then fail every request (a demo model: hotweights demo-model DIR --size small)")


def main() -> int:
    models = json.load(sys.stdin)
    p = parser()
    from .start import is_cpu_build

    supported: list[int] = []
    if is_cpu_build():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    out = {}
    for m in models:
        said = refused(p, m["args"], "vLLM")
        if not said and supported:
            with contextlib.suppress(OSError, ValueError):
                said = head_problem(Path(m["checkpoint"]), supported)
        if said:
            out[m["name"]] = said
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
