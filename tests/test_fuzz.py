"""The daemon fuzzer, short form: a few thousand hostile frames, then the daemon is unharmed.

The long run (>= 100,000 frames) is `python tests/fuzz_daemon.py --frames 100000 --json`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FUZZER = Path(__file__).resolve().parent / "fuzz_daemon.py"


@pytest.mark.slow  # 6-9 s: the fast tier stays under 3 min
def test_a_few_thousand_hostile_frames_leave_the_daemon_unharmed():
    r = subprocess.run([sys.executable, str(FUZZER), "--frames", "3000", "--seed", "7", "--json"],
                       capture_output=True, text=True, timeout=600)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["passed"], json.dumps({k: result[k] for k in ("checks", "engine", "fuzzer_failures", "after",
                                                                "baseline", "open_fds_after")}, indent=1)
    assert r.returncode == 0
    assert sum(result["cases"].values()) == 3000
