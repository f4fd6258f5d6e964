"""``benchmarks/switch_trace.py`` on the CPU (three tiny demo models, the embedded engine): a seeded trace of
bursty, skewed, streamed requests with long prompts, run through a parking front and a stop-and-start front. No
request may be answered by another model's engine, every request of the parking front is answered, and parking
serves more requests within the TTFT target than stopping and starting (bounds loose for a shared 2-core box).

Run: pytest tests/test_switch_trace.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_trace_through_the_switch_never_crosses_models_and_parking_beats_stopping(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "switch_trace.py"), "--modes", "park,restart",
                           "--duration-s", "20", "--rate", "1", "--out", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=840, cwd=ROOT / "benchmarks")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    park, restart = result["park"], result["restart"]
    assert result["crossed"] == 0 and park["probe_tells_models_apart"], park["probe_answers"]
    assert park["outcomes"] == {"ok": park["requests"]} and park["requests"] == result["trace"]["requests"] > 10
    assert park["switches"] > 3  # the trace asks for every model, in turns
    assert park["ttft_p99_s"] is not None and park["ttft_p99_s"] < 10, park["ttft_p99_s"]
    assert park["goodput_rps"] > restart["goodput_rps"], (park["goodput_rps"], restart["goodput_rps"])
