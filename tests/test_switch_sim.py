"""``benchmarks/switch_sim.py``: the switch's own scheduler over simulated vLLM engines (issue 69). A replay answers
every request of its trace once and whole, token times in order, the same twice; it never has more engines awake
than ``max_awake`` nor more than the memory model lets fit; what it computes is every prompt once and every dropped
KV cache again, none for a held stream, where a stream continued from its tokens computes them again.

Run: pytest tests/test_switch_sim.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from switch_sim import Sim, mode_of, rows_of  # noqa: E402
from switch_trace import make_trace  # noqa: E402

from hotweights.switch.config import ModelConfig, SwitchConfig  # noqa: E402
from hotweights.switch.memory import over_mib  # noqa: E402
from hotweights.switch.states import ModelState  # noqa: E402

NAMES = [f"m{i}" for i in range(5)]
HOST = {"m3", "m4"}
H100_MIB = 81_559


def replay(mode: str, seconds: float = 20.0, checked: bool = False) -> Sim:
    schedule, awake, keep = mode_of(mode)
    models = tuple(ModelConfig(n, Path("/sim") / n, parked_weights="host" if n in HOST else "gpu") for n in NAMES)
    config = SwitchConfig(models, max_awake=awake, schedule=schedule, preempt=True, keep_kv=keep)
    trace = make_trace(NAMES, argparse.Namespace(zipf_s=1.1, prompt_range=(32, 2000), max_tokens_range=(32, 512),
                                                 probe_every=5, per_model_rate=True, burst_size=0,
                                                 burst_every_s=20.0, duration_s=seconds), 0.5, 0)

    class Checked(Sim):
        def compute(self) -> None:  # every tick: the cap, and memory as the scheduler's model counts it
            up = [e for e in self.engines.values() if e.state in (ModelState.AWAKE, ModelState.LEAVING)]
            assert awake == "auto" or len(up) <= awake, [e.name for e in up]
            holders = [e.view(keep, self.now).holder() for e in self.engines.values()]
            assert over_mib(0, self.total_mib, holders) <= 0, [(e.name, e.state) for e in self.engines.values()]
            super().compute()

    sim = (Checked if checked else Sim)(trace, config, HOST, H100_MIB)
    sim.trace = trace  # type: ignore[attr-defined]
    sim.run()
    return sim


def test_a_replay_answers_every_request_once_and_whole_within_the_cap_and_memory_the_same_twice():
    sim = replay("mixed_preempt_deadline_awake2", checked=True)
    trace = sim.trace  # type: ignore[attr-defined]
    assert len(sim.done) == len(trace) and len({id(s) for s in sim.done}) == len(trace)
    assert sorted((s.request.at_s, s.request.model) for s in sim.done) == sorted((r.at_s, r.model) for r in trace)
    for s in sim.done:
        assert len(s.tokens) == s.request.max_tokens and s.tokens == sorted(s.tokens) and s.tokens[0] > s.arrived
    assert sim.switches > 0 and {s.request.model for s in sim.done} == set(NAMES)
    again = replay("mixed_preempt_deadline_awake2")
    assert [s.tokens for s in again.done] == [s.tokens for s in sim.done]  # no clock but its own


@pytest.mark.parametrize("mode", ["mixed_preempt_deadline", "mixed_preempt_nokv"])
def test_held_streams_compute_nothing_again_and_continued_ones_do(mode):
    sim = replay(mode, checked=True)
    prompts = sum(len(r.prompt) for r in sim.trace)  # type: ignore[attr-defined]
    rows = rows_of(sim.done)
    assert len(rows) == len(sim.trace) and all(r["ttft_s"] > 0 for r in rows)  # type: ignore[attr-defined]
    assert sim.prefilled == prompts + sim.recomputed  # every token computed again is a dropped KV cache's
    if mode.endswith("_nokv"):
        assert sim.held == 0 and sim.recomputed > 0  # each continuation computes its prompt and tokens again
    else:
        assert sim.held > 0  # held streams drop nothing: what is computed again is vLLM's own preemption's, or a
        # leave's that could not hold (memory)


@pytest.mark.parametrize("pause_on_join", [True, False])
def test_a_stream_let_in_has_no_clock_until_it_joins_and_a_leave_before_then_pauses_it_as_it_joins(
        monkeypatch, pause_on_join):
    """The front's window (an H100 run at 91e7e2f): a request let in counts in flight at once, but its stream joins
    its model's streams (its clock known to the scheduler, a leave able to pause it) only ``JOIN_S`` later. A leave
    in between pauses the rest; the late one runs on in flight while its engine stays leaving, as in the front, or
    with ``--pause-on-join`` pauses as it joins."""
    import switch_sim

    monkeypatch.setattr(switch_sim, "PAUSE_ON_JOIN", pause_on_join)
    sim = replay("mixed_preempt_deadline_awake2", seconds=10.0)
    e = sim.engines["m1"]
    e.state, e.running, e.waiting = ModelState.AWAKE, [], []
    old, new = (switch_sim.Stream(r, sim.now, len(r.prompt)) for r in sim.trace[:2])  # type: ignore[attr-defined]
    old.joined, new.joined = sim.now - 1.0, sim.now + switch_sim.JOIN_S
    e.running = [old, new]
    v = e.view(True, sim.now)
    assert v.inflight == 2 and v.clocks == (old.clock,)  # the new one's clock not known yet
    sim.leave(e, True, "m0")
    assert e.state is ModelState.LEAVING and e.running == [new] and [s for *_, s in e.waiting] == [old]
    sim.now = new.joined
    sim.joins()
    assert e.running == ([] if pause_on_join else [new])
    assert [s for *_, s in e.waiting] == ([old, new] if pause_on_join else [old]) and e.kv_held


def test_a_host_tier_wake_costs_what_host_wake_ms_says(monkeypatch, capsys):
    """``--host-wake-ms`` and ``--host-park-ms`` set what a host-tier wake and park cost, and the result says so."""
    import json

    import switch_sim

    spans: list[float] = []
    finish = switch_sim.Sim.finish

    def timed(self, op):  # a host-tier wake that parked nothing: its span is the wake alone
        if op.wake is not None and op.wake.host and not op.parks:
            spans.append(self.now - op.began)
        finish(self, op)
    monkeypatch.setattr(switch_sim.Sim, "finish", timed)
    for name in ("WAKE_S", "PARK_S"):  # main sets them and the others below; the next test has its own
        monkeypatch.setattr(switch_sim, name, dict(getattr(switch_sim, name)))
    for name in ("STEP_S", "JOIN_S", "PAUSE_ON_JOIN"):
        monkeypatch.setattr(switch_sim, name, getattr(switch_sim, name))
    monkeypatch.setattr(sys, "argv", ["switch_sim.py", "--rates", "0.5", "--modes", "mixed_preempt_deadline_awake2",
                                      "--host-wake-ms", "120", "--host-park-ms", "30", "--json"])
    assert switch_sim.main() == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["host_wake_ms"], said["host_park_ms"]) == (120, 30)
    assert spans and all(0.120 - 1e-9 <= s <= 0.120 + 2 * switch_sim.DT for s in spans), spans
    assert switch_sim.PARK_S[True] == 0.030
