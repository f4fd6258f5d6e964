"""Devices by physical identity: a CUDA device is named by its GPU UUID, never an index.

``CUDA_VISIBLE_DEVICES`` reorders indices between processes; the UUID is what the
cache key stores, so an engine with another visible-device order still finds its entry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..key import pool_device


@dataclass(frozen=True, slots=True)
class Device:
    kind: str  # "cpu" | "cuda"
    uuid: str  # "host" for cpu, "GPU-..." for cuda
    index: int  # torch index in this process (-1 for cpu)

    @property
    def pool_device(self) -> str:
        return pool_device(self.kind, self.uuid)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.kind == "cpu" else torch.device("cuda", self.index)


def resolve_device(device: str) -> Device:
    """``cpu``, ``cuda`` (current device) or ``cuda:N`` -> Device with its UUID."""
    if device == "cpu":
        return Device("cpu", "host", -1)
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but torch sees no CUDA device")
        index = torch.cuda.current_device() if device == "cuda" else int(device.split(":", 1)[1])
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA devices are visible")
        return Device("cuda", gpu_uuid(index), index)
    raise ValueError(f"unknown device {device!r}; use cpu, cuda or cuda:N")


@functools.cache  # fixed for the life of a process (CUDA_VISIBLE_DEVICES is read once)
def gpu_uuid(index: int) -> str:
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def index_of_uuid(uuid: str) -> int:
    """This process's torch index of the GPU with ``uuid``; ValueError if not visible."""
    for i in range(torch.cuda.device_count()):
        if gpu_uuid(i) == uuid:
            return i
    raise ValueError(f"GPU {uuid} is not visible to this process (check CUDA_VISIBLE_DEVICES)")


def process_gpu_bytes(index: int) -> int:
    """GPU memory this process holds on device ``index`` as the driver counts it (NVML: context, allocator,
    graphs; mappings of the keeper's pools count too), else what torch's allocator reserves."""
    import os

    try:
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py, a dependency of vLLM CUDA builds

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid(index))
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, another pid namespace: the allocator's view
        pass
    return int(torch.cuda.memory_reserved(index))
