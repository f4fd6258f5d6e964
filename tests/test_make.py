"""The Makefile's set-up steps, as a new user's machine runs them: ``make demo`` installs what the demo runs and no
more (not the tests' and the lint's tools: Ray, Chromium's driver, mypy, ...), and the CPU torch recipe installs
from what pip reaches without a retry warning per package where the PyTorch index cannot be reached.

Run: pytest tests/test_make.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(target: str, venv: Path) -> str:
    """What ``make -n TARGET`` would run for a fresh venv (nothing runs)."""
    done = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_the_demo_and_not_the_tests_tools(tmp_path):
    demo = dry_run("demo", tmp_path / "venv")
    installs = re.findall(r"pip install -q -e '\.\[([^\]]+)\]'", demo)
    assert installs == ["serve"], demo
    assert "install_torch.sh" in demo and "verify" in demo
    test = dry_run("test-fast", tmp_path / "venv")
    assert re.findall(r"pip install -q -e '\.\[([^\]]+)\]'", test) == ["serve", "test,lint"], test


@pytest.mark.slow
def test_the_cpu_torch_recipe_installs_from_what_pip_reaches_without_retrying_an_unreachable_index(tmp_path):
    """A fresh venv; the PyTorch index on a port where nothing listens: torch comes from what pip reaches here (the
    wheel on disk, the mirror) and pip prints no warning at all, where asking that index first printed a retry
    warning for each of torch's packages."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=120)
    py = str(tmp_path / "venv" / "bin" / "python")
    import torch

    env = {**os.environ, "TORCH_SPEC": f"torch=={torch.__version__}", "TORCH_INDEX": "http://127.0.0.1:9/whl/cpu"}
    done = subprocess.run(["bash", str(ROOT / ".ci" / "install_torch.sh"), py], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Retrying" not in done.stdout + done.stderr and "WARNING" not in done.stdout + done.stderr, done.stderr
    version = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                             timeout=120)
    assert version.stdout.strip() == torch.__version__


def test_the_torch_recipe_says_in_one_line_what_it_could_not_install(tmp_path):
    """No such torch anywhere: one line naming the spec and the index, and exit 1 (no venv needed: pip refuses
    before it installs anything)."""
    env = {**os.environ, "TORCH_SPEC": "torch==0.0.1+nowhere", "TORCH_INDEX": "http://127.0.0.1:9/whl/cpu",
           "PIP_RETRIES": "0"}
    done = subprocess.run(["bash", str(ROOT / ".ci" / "install_torch.sh"), sys.executable], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 1
    assert "could not install torch==0.0.1+nowhere" in done.stderr.splitlines()[0], done.stderr
