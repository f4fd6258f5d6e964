"""hotweights: keep LLM weights resident across inference-engine restarts.

Importing this package imports no torch: the daemon and CLI start fast. The engine-side
helpers below load torch on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["AttachConfig", "CacheKey", "attach_module", "attach_tensors", "load_model", "__version__"]

_LAZY = {
    "AttachConfig": "hotweights.config",
    "CacheKey": "hotweights.key",
    "attach_module": "hotweights.engines.modules",
    "attach_tensors": "hotweights.loading.attach",
    "load_model": "hotweights.engines.transformers",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotweights' has no attribute {name!r}")
