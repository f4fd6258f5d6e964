"""``--model-loader-extra-config`` for load format ``hotweights``.

vLLM-free, so it is unit-tested without vLLM. Sleep mode (``--enable-sleep-mode``) is not refused with
zero-copy weights: vLLM's sleep offloads (level 1) or discards (level 2) what its own allocator holds,
and mapped weights are not in it, so they stay mapped and shared while the engine sleeps (measured on
an H200: ``benchmarks/results/gpu_sleep/``).
"""

from __future__ import annotations

from typing import Any

from ...config import AttachConfig

LOAD_FORMAT = "hotweights"
LAYOUTS = ("auto", "engine", "checkpoint")


def split_extra_config(extra: Any) -> tuple[str, AttachConfig]:
    """``--model-loader-extra-config`` -> (layout, AttachConfig); unknown keys raise, named."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config must be a JSON object for load format {LOAD_FORMAT}, "
                         f"got {type(extra).__name__}")
    extra = dict(extra)
    layout = extra.pop("layout", "auto")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    try:
        return layout, AttachConfig.from_dict(extra)
    except ValueError as exc:
        if "unknown weight-cache config keys" in str(exc):
            raise ValueError(f"{exc} (plus 'layout' for the vLLM plugin)") from None
        raise
