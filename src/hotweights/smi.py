"""``nvidia-smi``, read in one place and torch-free: the switch's GPU memory (``switch/gpus.py``) and a verify run's
record (``verify/environment.py``, ``verify/memory.py``) ask it here. Where it is absent, fails or hangs there is
nothing to read, and the callers say what that means for them.
"""

from __future__ import annotations

import shutil
import subprocess

TIMEOUT_S = 10.0  # a driver that hangs must not hang the front's scheduler or a verify run


def smi_rows(*args: str, fmt: str = "csv,noheader,nounits") -> list[list[str]]:
    """nvidia-smi's CSV rows for ``args`` (a ``--query-...``, and ``--id=...`` to select GPUs), each field stripped;
    [] where it is absent, fails or takes longer than ``TIMEOUT_S``."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", *args, f"--format={fmt}"], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [[x.strip() for x in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
