"""nvidia-smi read in one place (``smi.py``): the switch's GPU memory and a verify run's record, through a stand-in
``nvidia-smi`` executable on PATH that prints what an H200 box's prints (a real process, run as the real one is).

Run: pytest tests/test_smi.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hotweights import smi
from hotweights.switch.gpus import GpuMemory, gpu_memory, gpu_mib_by_pid
from hotweights.verify.environment import gpu_description
from hotweights.verify.memory import sample

# two GPUs as nvidia-smi numbers them; the stand-in answers each query the callers make, and logs its arguments
FAKE = r"""#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls"
case "$*" in
  *hang*) sleep 30 ;;
  *--query-gpu=index,uuid,memory.total,memory.free*)
    echo "0, GPU-aaaa1111-0000, 143771, 100000"
    echo "1, GPU-bbbb2222-0000, 143771, 50000" ;;
  *--query-compute-apps=pid,used_memory*)
    echo "4242, 1900"
    echo "4343, 10750" ;;
  *--id=1*--query-gpu=name,driver_version,memory.total*) echo "NVIDIA H200, 580.159.04, 143771 MiB" ;;
  *--query-gpu=name,driver_version,memory.total*)
    echo "NVIDIA H200, 580.159.04, 143771 MiB"
    echo "NVIDIA H200, 580.159.04, 143771 MiB" ;;
  *--query-gpu=index,memory.used*)
    echo "0, 43771"
    echo "1, 93771" ;;
  *) echo "unknown query: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(FAKE)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return bin_dir


def test_the_switch_reads_each_gpu_by_cuda_index_under_cuda_visible_devices(fake_smi):
    both = {0: GpuMemory(143771, 100000), 1: GpuMemory(143771, 50000)}
    assert gpu_memory() == both
    assert gpu_memory(visible="1") == {0: GpuMemory(143771, 50000)}  # CUDA numbers what it sees from 0
    assert gpu_memory(visible="GPU-bbbb,0") == {0: both[1], 1: both[0]}  # a UUID prefix, in the order given
    assert gpu_memory(visible="1,7,0") == {0: both[1]}  # CUDA stops at the first entry it cannot use
    assert gpu_mib_by_pid() == {4242: 1900, 4343: 10750}


def test_a_verify_run_records_the_gpus_it_may_use_and_their_memory(fake_smi, monkeypatch):
    assert gpu_description() == "2 x NVIDIA H200, 580.159.04, 143771 MiB"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu_description() == "NVIDIA H200, 580.159.04, 143771 MiB"
    assert "--id=1" in (fake_smi / "calls").read_text().splitlines()[-1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert sample("cuda", socket_dir=Path("/nonexistent-socket-dir"))["gpu_used_mib"] == {"0": 43771, "1": 93771}


def test_without_nvidia_smi_or_with_one_that_fails_or_hangs_there_is_nothing_to_read(fake_smi, monkeypatch):
    assert smi.smi_rows("--query-gpu=nothing") == []  # the stand-in fails on a query it does not know
    monkeypatch.setattr(smi, "TIMEOUT_S", 0.5)
    began = time.monotonic()
    assert smi.smi_rows("--query-gpu=hang") == [] and time.monotonic() - began < 5
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpu_memory() == {} and gpu_mib_by_pid() == {}
    assert gpu_description() == "nvidia-smi not found, or it failed"
