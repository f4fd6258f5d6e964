"""What ``hotweights serve`` is asked to serve: one value, torch-free (a ``--park-on-exit`` launcher reads it
without importing the engine)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import AttachConfig


@dataclass(frozen=True, slots=True)
class ServeConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"
    device: str = "cpu"
    served_model_name: str | None = None
    max_model_len: int | None = None
    load_format: str = "hotweights"
    model_impl: str = "auto"  # auto | native | transformers (engines/native.py covers the Llama family)
    access_log: bool = True  # a line per request, as vLLM's uvicorn writes (--disable-uvicorn-access-log)
    attach: AttachConfig = field(default_factory=AttachConfig)

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "hotweights"):
            raise ValueError(f"load_format must be 'auto' or 'hotweights', got {self.load_format!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
