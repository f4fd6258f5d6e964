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

import logging
import sys
from pathlib import Path

from ... import evidence
from ...client import connect_for
from ...errors import DaemonUnavailable, TrustError
from .options import split_extra_config
from .start import VllmStart

logger = logging.getLogger(__name__)


def strict_target(argv: list[str]) -> tuple[str, dict] | None:
    """``(model, extra config)`` when ``argv`` starts vLLM with load format hotweights and
    the fallback off; None otherwise (or when the command line cannot be read)."""
    start = VllmStart.parse(argv)
    return (start.model, start.extra) if start.is_strict and start.model and start.extra is not None else None


def check(start: VllmStart | None = None) -> None:
    """Exit 1 with the strict message when a strict start cannot possibly be served (``start``: this
    process's own command line when None, as in the plugin)."""
    start = start or VllmStart.parse(sys.argv[1:])
    if not start.is_strict or start.model is None:
        return
    try:
        _, config = split_extra_config(start.extra)
        with connect_for(config) as client:
            entries = client.status().rows()
    except ValueError:
        return  # the loader reports a bad extra config, named
    except DaemonUnavailable as exc:
        _fail(f"daemon unavailable: {exc}", f"start the daemon and preload the model for vLLM ({_preload(start)})")
    except TrustError as exc:
        _fail(f"untrusted daemon: {exc}")
    name = Path(start.model).name
    held = sorted({e.dtype for e in entries if e.model == name})
    if not held:
        _fail(f"cache miss for {name}: the daemon holds no entry of this model ({len(entries)} entries)",
              f"preload the model for vLLM ({_preload(start)})")
    wanted = start.requested_dtype
    if wanted and wanted not in held:
        _fail(f"cached entries of {name} differ: dtype: cached={'/'.join(held)} requested={wanted}",
              f"start with --dtype {held[0]}, or make a {wanted} entry (hotweights preload --engine vllm --model "
              f"{start.model} --dtype {wanted})")


def _preload(start: VllmStart) -> str:
    """The preload that makes this start's entry: vLLM's engine layout, with its dtype."""
    dtype = f" --dtype {start.dtype}" if start.dtype else ""
    return f"hotweights preload --engine vllm --model {start.model}{dtype}"


def _fail(reason: str, advice: str = evidence.START_AND_PRELOAD) -> None:
    logger.error(evidence.strict_failure(reason, advice))
    raise SystemExit(1)
