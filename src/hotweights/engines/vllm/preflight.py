"""Strict starts fail in seconds, not after vLLM's start-up.

vLLM calls a loader only after its own start-up (a minute and more on a GPU). With
``--load-format hotweights`` and ``{"fallback": false}`` on the command line, the plugin
checks at registration, in the process that parses that command line: no daemon (or an
untrusted one), a daemon that holds no entry of this model at all, or none in the dtype
named by ``--dtype``, is a certain failure, so it logs the strict evidence message and exits
1 right there. Anything finer (``--dtype auto``, layout, TP rank) is left to the loader,
which knows vLLM's resolved config.

``hotweights vllm ARGS...`` (``launcher.py``) runs the same check before vLLM is imported
at all, so a strict start fails in a fraction of a second instead of after vLLM's import.

It is coarser than ``loading.diagnosis`` on purpose: before vLLM has resolved its config
and the TP rank no key can be built, so it fails only where every candidate must fail.

Not covered: options given through ``--config`` files.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ... import evidence
from ...client import connect_for
from ...errors import DaemonUnavailable, TrustError
from ...loading.diagnosis import advice_for
from ...replies import Outcome
from .options import LOAD_FORMAT, split_extra_config

logger = logging.getLogger(__name__)


def read_argv(argv: list[str]) -> tuple[argparse.Namespace, list[str], dict | None]:
    """The flags of a vLLM command line that hotweights reads (``load_format``, ``model``, ``dtype``), the
    rest, and the extra config (None when it is not a JSON map: vLLM reports that)."""
    parser = argparse.ArgumentParser(add_help=False)
    for flag in ("--load-format", "--model-loader-extra-config", "--model", "--dtype"):
        parser.add_argument(flag)
    known, rest = parser.parse_known_args(argv)
    try:
        extra = json.loads(known.model_loader_extra_config or "{}")
    except json.JSONDecodeError:
        return known, rest, None
    return known, rest, extra if isinstance(extra, dict) else None


def strict_target(argv: list[str]) -> tuple[str, dict] | None:
    """``(model, extra config)`` when ``argv`` starts vLLM with load format hotweights and
    the fallback off; None otherwise (or when the command line cannot be read)."""
    known, rest, extra = read_argv(argv)
    model = known.model or (rest[1] if len(rest) > 1 and rest[0] == "serve" else None)
    if known.load_format != LOAD_FORMAT or extra is None or extra.get("fallback", True) is not False or not model:
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
            entries = client.status().rows()
    except ValueError:
        return  # the loader reports a bad extra config, named
    except DaemonUnavailable as exc:
        _fail(f"daemon unavailable: {exc}")
    except TrustError as exc:
        _fail(f"untrusted daemon: {exc}")
    name = Path(model).name
    held = sorted({e.dtype for e in entries if e.model == name})
    if not held:
        _fail(f"cache miss for {name}: the daemon holds no entry of this model ({len(entries)} entries)",
              advice_for(Outcome.MISS))
    wanted = _requested_dtype(argv if argv is not None else sys.argv[1:])
    if wanted and wanted not in held:
        _fail(f"cached entries of {name} differ: dtype: cached={'/'.join(held)} requested={wanted}",
              f"start with --dtype {held[0]}, or make a {wanted} entry (hotweights preload --engine vllm --model "
              f"{model} --dtype {wanted})")


def _requested_dtype(argv: list[str]) -> str | None:
    """The dtype a start asks for by name (``--dtype``), None for ``auto`` (the checkpoint decides)."""
    dtype = read_argv(argv)[0].dtype
    return {"half": "float16", "float": "float32"}.get(dtype, dtype) if dtype and dtype != "auto" else None


def _fail(reason: str, advice: str = evidence.START_AND_PRELOAD) -> None:
    logger.error(evidence.strict_failure(reason, advice))
    raise SystemExit(1)
