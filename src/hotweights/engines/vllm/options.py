"""``--model-loader-extra-config`` for load format ``hotweights``.

vLLM-free, so it is unit-tested without vLLM. Sleep mode (``--enable-sleep-mode``) is not refused with
zero-copy weights: vLLM's sleep offloads (level 1) or discards (level 2) what its own allocator holds,
and mapped weights are not in it, so they stay mapped and shared while the engine sleeps (measured on
an H200: ``benchmarks/results/gpu_sleep/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...config import AttachConfig
from ...rows import EntryRow

LOAD_FORMAT = "hotweights"
LAYOUTS = ("auto", "engine", "checkpoint")
LAYOUT_PREFIX = "vllm/"  # an engine-layout entry's layout: vllm/<version>[/quant=..][/kv=..] (keys.py)


def engine_rows(rows: list[EntryRow], model_dir: str | Path, tp_size: int | None = None) -> list[EntryRow]:
    """The keeper's engine-layout rows of the checkpoint in ``model_dir`` (by its directory's name, as the key's
    ``model``), of a ``tp_size``-way start when given."""
    name = Path(model_dir).name
    return [r for r in rows if r.model == name and r.layout.startswith(LAYOUT_PREFIX)
            and (tp_size is None or r.rank[1] == tp_size)]


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
