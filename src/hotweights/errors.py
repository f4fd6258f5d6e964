"""Exception types. A class exists only where a caller acts differently on it.

Expected outcomes of an attach (miss, mismatch, daemon absent) are values, not
exceptions: see ``hotweights.client.Outcome`` and ``hotweights.loading.attach.AttachResult``. These types are for
the exceptional paths and for the strict (fallback disabled) policy.
"""

from __future__ import annotations

from pathlib import Path


class HotweightsError(Exception):
    """Base class of every error hotweights raises on purpose."""


class ProtocolError(HotweightsError):
    """A frame or message broke the wire contract (size, type, fds, unknown op)."""

    def __init__(self, message: str, *, code: str = "protocol") -> None:
        super().__init__(message)
        self.code = code


class ManifestError(HotweightsError):
    """A manifest or tensor spec is inconsistent (bad dtype, overflow, out of pool)."""


class WrongEntry(ProtocolError):
    """The daemon answered an attach with another key or pools on another device: a broken
    invariant that no fallback may paper over."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="wrong_entry")


class DaemonUnavailable(HotweightsError):
    """No daemon answers on the socket (absent, starting, or refused)."""


class DaemonAlreadyRunning(HotweightsError):
    """Another daemon holds the lock of this socket directory."""


class TrustError(HotweightsError):
    """The socket directory or a peer failed an ownership or permission check."""


class PoolError(HotweightsError):
    """A shareable allocation could not be created, exported, imported or mapped."""


class CheckpointError(HotweightsError):
    """A checkpoint directory cannot be read as safetensors (missing, corrupt, dtype)."""


class WeightCacheUnusable(HotweightsError):
    """Strict policy: the cache could not be used and fallback is disabled."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


EXTRAS = {"torch": "engine", "safetensors": "engine", "transformers": "engine", "tokenizers": "engine",
          "uvicorn": "serve", "pydantic": "serve", "starlette": "serve", "jinja2": "serve", "httpx": "serve",
          "ray": "cluster", "tomli_w": "cluster"}


# a command whose extra brings every module it needs (serve includes engine)
COMMAND_EXTRAS = {"serve": "serve", "switch": "serve", "cluster": "cluster"}


def install_command(extra: str) -> str:
    """How to add ``extra``: hotweights is not on the package index, so from the clone this one runs from, where it
    does (an editable install), else from its wheel or clone."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return f"pip install '{root}[{extra}]'"
    return f"pip install 'PATH[{extra}]' (PATH: hotweights' wheel or clone; it is not on PyPI)"


def missing_extra(module: str, command: str = "") -> str:
    """One line naming the extra (or package) that brings ``module``: the command's whole extra when it has one,
    so that one install is enough."""
    root = module.split(".")[0]
    if root in EXTRAS:
        return f"{root} is not installed; {install_command(COMMAND_EXTRAS.get(command, EXTRAS[root]))}"
    if root == "vllm":
        return ("vllm is not installed here; install hotweights into vLLM's own environment (pip install "
                "dist/hotweights-*.whl; make wheel builds it)")
    return f"{root} is not installed (pip install {root})"
