"""Engine-side configuration: the keys a user passes as ``--model-loader-extra-config``.

Names follow vLLM's weight-cache loader: ``mode``, ``fallback``, ``socket_dir``,
``socket_path``, ``connect_timeout_s``, ``state_timeout_s``, plus ``publish``
(write-through after a disk load) and ``rehash`` (hash the checkpoint at every start:
catches bytes changed through a shared mapping, which keep mtime and ctime). Unknown
keys are an error, named.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

MODES = ("zero_copy", "copy")
DEFAULT_POOL_BYTES = 1 << 30  # a pool's size when a writer lays an entry out (``loading/publish.py``)


@dataclass(frozen=True, slots=True)
class AttachConfig:
    mode: str = "zero_copy"
    fallback: bool = True
    socket_dir: str | None = None
    socket_path: str | None = None
    connect_timeout_s: float = 2.0
    state_timeout_s: float = 10.0
    publish: bool = False
    rehash: bool = False  # hash the checkpoint files at every start instead of trusting the digest cache

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("fallback", "publish", "rehash"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("connect_timeout_s", "state_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        for name in ("socket_dir", "socket_path"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a path string, got {value!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> AttachConfig:
        """Build from a JSON-style dict; unknown keys raise ValueError naming them."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown weight-cache config keys {unknown}; allowed: {sorted(known)}")
        return cls(**data)
