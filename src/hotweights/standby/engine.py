"""What an engine tells the standby: what to import ahead, which packages and variables pin a standby.

One ``EngineSpec`` per engine, found by name (``spec``) without importing the engine; the spec module is
data only. The vLLM one is ``engines/vllm/standby.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from .fingerprint import Fingerprint

SPECS = {"vllm": "hotweights.engines.vllm.standby"}  # engine -> the module whose SPEC it is


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str  # in the standby's paths and log lines
    preimports: tuple[str, ...]  # imported by the standby before it answers
    packages: tuple[str, ...]  # their versions and files pin a standby
    env_prefixes: tuple[str, ...]  # besides fingerprint.ENV_PREFIXES
    after_imports: Callable[[], list[str]] = field(default=lambda: [])  # run once imported; what it lacked
    env_after_fork: tuple[str, ...] = ()  # of those prefixes, read by the engine only after the fork: no pin

    def fingerprint(self, environ: dict[str, str] | None = None) -> Fingerprint:
        return Fingerprint.of(self.packages, self.env_prefixes, environ, self.env_after_fork)


def spec(engine: str) -> EngineSpec:
    if engine not in SPECS:
        raise ValueError(f"no standby for engine {engine!r}; known: {', '.join(sorted(SPECS))}")
    found: EngineSpec = importlib.import_module(SPECS[engine]).SPEC
    return found
