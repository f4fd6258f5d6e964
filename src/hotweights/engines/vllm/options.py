"""``--model-loader-extra-config`` for load format ``hotweights``, and the sleep-mode rule.

vLLM-free, so it is unit-tested without vLLM.
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


def sleep_mode_refusal(enable_sleep_mode: bool, mode: str, layout: str) -> str | None:
    """Why zero_copy cannot run with sleep mode, or None when the combination is fine."""
    if enable_sleep_mode and mode == "zero_copy" and layout != "checkpoint":
        return ("load format hotweights with mode=zero_copy cannot be used with --enable-sleep-mode: sleep mode "
                "offloads and discards weights through vLLM's own allocator, but zero-copy weights live in the "
                "daemon's shared pools. Use --model-loader-extra-config '{\"mode\": \"copy\"}' (weights become "
                "engine-owned), or '{\"layout\": \"checkpoint\"}' (streamed into vLLM's own weights), or drop "
                "--enable-sleep-mode")
    return None
