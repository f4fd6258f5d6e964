"""``benchmarks/switch_turns.py``: where a switch's time went, read from its front's and its vLLM engines' logs (issue
69), over lines as the front and vLLM 0.26 write them (an H100 run's, shortened)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from switch_turns import turns

HELD = "held with their KV caches, going on at its next wake"
FRONT = "\n".join(f"2026-12-06 14:16:{at} INFO hotweights.switch: switch: {what}" for at, what in (
    ("29,551", f"m4 leaves for m3: 0 request(s) in flight end first (6 {HELD}), 5 wait for m3"),
    ("29,552", "m4: a stream held after 14 token(s); its KV cache kept; it goes on at the model's next wake"),
    ("32,500", "m4 deep-parked for m3 once its requests ended, 15.26 GiB to host memory"),
    ("32,896", "m3 awake in 0.395 s (weights host; its requests waited 1.623 s; woke m3 in 0.395 s)"),
    ("33,680", f"m3 leaves for m4: 0 request(s) in flight end first (5 {HELD}), 11 wait for m4"),
    ("33,811", "m3 deep-parked for m4 once its requests ended, 15.26 GiB to host memory"),
    ("34,209", "m4 awake in 0.397 s (weights host; its requests waited 1.431 s; woke m4 in 0.397 s)"),
    ("35,078", "m4 leaves for m3: 2 request(s) in flight end first, 7 wait for m3"),
    ("35,205", "m4 parked for m3 once its requests ended"),
    ("40,000", "m0 awake in 0.013 s (weights kept)")))
VLLM = ("(APIServer pid=10925) INFO 12-06 14:16:{} [loggers.py:310] Engine 000: Avg prompt throughput: 314.4 "
        "tokens/s, Avg generation throughput: {} tokens/s, Running: {} reqs, Waiting: 0 reqs")
M3 = "\n".join((VLLM.format("27", "52.8", 12),
                "(EngineCore pid=10964) INFO 12-06 14:16:28 [hotweights] Woke m3 in 0.336 s (weights from host)",
                VLLM.format("37", "40.8", 5)))


def test_a_runs_turns_read_from_the_front_and_vllm_logs_within_its_window():
    since = datetime.datetime(2026, 12, 6, 14, 16, 30)
    got = turns(FRONT, {"m3": M3, "m0": "the embedded engine logs no throughput\n"}, since,
                datetime.datetime(2026, 12, 6, 14, 16, 39))
    assert set(got) == {"m3", "m4"}  # m4's first leave and m0's wake are outside the window
    assert got["m3"] == {"wakes": 1, "wake_s": 0.395, "leaves": 1, "turn_s": 0.784, "leave_to_parked_s": 0.131,
                         "streams_asked_per_leave": 5.0,
                         "engine": {"lines": 1, "generation_tokens_s": 40.8, "running": 5.0}}
    # a leave with no stream held or paused counts 0 asked; its park, the plain one, ends its leave too
    assert got["m4"] == {"wakes": 1, "wake_s": 0.397, "leaves": 1, "turn_s": 0.869, "leave_to_parked_s": 0.127,
                         "streams_asked_per_leave": 0.0}
    everything = turns(FRONT, {})
    assert everything["m4"]["leaves"] == 2 and everything["m4"]["leave_to_parked_s"] == 1.538  # 2.949 s and 0.127 s
    assert everything["m0"]["wakes"] == 1
