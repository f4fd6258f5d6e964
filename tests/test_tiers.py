"""Tiers from traffic (issue 69, part 3; ``switch/tiers.py``): the rule as a table over views with Zipf and equal
demand, then a real front on the CPU (``--tiers traffic``) whose busy host-tier model takes the place of an idle
GPU-tier one, the idle one's weights let go to host memory.

Run: pytest tests/test_tiers.py
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest
from switch_front import Front, private_keeper, wait_started

from hotweights.switch.config import ModelConfig, SwitchConfig
from hotweights.switch.memory import GpuNeed
from hotweights.switch.snapshot import Snapshot, View
from hotweights.switch.states import ModelState
from hotweights.switch.tiers import Move, step

GIB = 1024
NOW = 1000.0


def snap(tiers: str, states: str = "pppp", deepens: bool = True, total_gib: int = 112, wake_s=None) -> Snapshot:
    """Four 8B-sized models a-d; ``tiers``: each one's parked weights (g: GPU, h: host); ``states``: a awake, p
    parked (deep where its weights are in host memory)."""
    need = GpuNeed((0,), 0.0, 15 * GIB, 1024, parked_mib=1950)
    config = SwitchConfig(tuple(ModelConfig(n, Path("/m") / n, parked_weights="gpu" if t == "g" else "host")
                                for n, t in zip("abcd", tiers)))
    views = tuple(View(c, ModelState.AWAKE if st == "a" else ModelState.PARKED if t == "g" else ModelState.DEEP,
                       need, deepens=deepens, wake_s=wake_s) for c, t, st in zip(config.models, tiers, states))
    return Snapshot(views, {0: total_gib * GIB}, NOW, "a")


CONFIG = SwitchConfig((ModelConfig("a", Path("/m/a")),), tier_window_s=300)
ZIPF = {"a": 0.02, "b": 0.05, "c": 0.6, "d": 0.1}  # c, on host memory, the busiest


def test_the_busiest_host_tier_model_takes_the_quietest_gpu_tier_models_place_where_the_gain_beats_two_copies():
    move = step(snap("gghh"), ZIPF, CONFIG, slots=2)
    assert move is not None and (move.name, move.to) == ("a", "host"), move  # a, the quietest, goes first
    assert "c gets 0.60 requests/s" in move.why
    # a demoted: the GPU tier has a place, and c's weights fit there: c goes up (the busiest of c, d)
    assert step(snap("hghh"), ZIPF, CONFIG, slots=2) == Move("c", "gpu", "0.60 requests/s, the busiest in host "
                                                                          "memory")


def test_nothing_moves_with_equal_rates_a_gain_below_the_copies_or_a_park_vllm_cannot_deepen():
    assert step(snap("gghh"), dict.fromkeys("abcd", 0.3), CONFIG, slots=2) is None  # equal: no gain
    # 0.01 requests/s more, 0.9 s saved each, over 300 s: 2.7 s against two copies of 15 GiB (11.8 s)
    assert step(snap("gghh"), {"a": 0.1, "b": 0.1, "c": 0.11, "d": 0.0}, CONFIG, slots=2) is None
    assert step(snap("gghh", wake_s=0.1), ZIPF, CONFIG, slots=2) is None  # its wakes from host memory cost nothing
    assert step(snap("gghh", deepens=False), ZIPF, CONFIG, slots=2) is None  # vLLM parked: it keeps its weights
    move = step(snap("gghh", states="aphh", deepens=False), ZIPF, CONFIG, slots=2)
    assert move is not None and (move.name, move.to) == ("a", "host")  # awake: its next park is a host tier's


def test_a_promotion_waits_until_the_gpu_has_room_for_its_weights():
    # b demoted but awake (its weights still on the GPU), a parked on the GPU tier: 37 + 17 + 15 (c's) + ... over
    assert step(snap("hghh", states="appp", total_gib=40), ZIPF, CONFIG, slots=2) is None
    assert step(snap("hghh", states="pppp", total_gib=40), ZIPF, CONFIG, slots=2) == Move(
        "c", "gpu", "0.60 requests/s, the busiest in host memory")


@pytest.mark.slow
def test_a_front_moves_its_busy_host_tier_model_onto_the_gpu_tier_and_the_idle_one_off_it(tmp_path):
    """``--tiers traffic`` on the CPU, three embedded models: ``a`` (the default) and ``b`` on the GPU tier, ``c`` in
    host memory and started by its first request. Only ``c`` is asked: ``b`` (parked, idle) moves to host memory at
    once, its engine's park deepened and its weights let go; then ``c`` takes the GPU tier's place (awake: its next
    park keeps its weights mapped, a level-1 park)."""
    from hotweights.demo_model import write_demo_model

    models = {n: write_demo_model(tmp_path / n, "tiny", seed=i) for i, n in enumerate("abc")}
    config = tmp_path / "switch.toml"
    config.write_text('[switch]\ntiers = "traffic"\ntier_window_s = 30\n' + "".join(
        f'[[model]]\nname = "{n}"\ncheckpoint = "{p}"\nargs = ["--max-model-len", "64"]\n'
        + ('parked_weights = "host"\nstart = "lazy"\n' if n == "c" else "") for n, p in models.items()))
    with private_keeper("hwtier-") as sock:
        f = wait_started(Front(tmp_path, {}, "--config", str(config), socket_dir=sock))
        try:
            client = f.client()
            for _ in range(12):
                client.completions.create(model="c", prompt="The weight cache", max_tokens=2, temperature=0)
            deadline = time.monotonic() + 60
            while f.state("c")["parked_weights"] != "gpu":
                assert time.monotonic() < deadline, f.log.read_text()[-3000:]
                time.sleep(0.2)
            b, c = f.state("b"), f.state("c")
            assert b["parked_weights"] == "host" and b["state"] == "deep-parked", b
            assert c["state"] == "awake" and f.state("a")["parked_weights"] == "gpu"
            urllib.request.urlopen(urllib.request.Request(f"{f.url}/switch/models/c/park", method="POST"), timeout=60)
            assert f.state("c")["state"] == "parked"  # a GPU tier's park: level 1, its weights kept mapped
        finally:
            f.interrupt()
    log = f.log.read_text()
    assert re.search(r"switch: b moves to the host memory tier \(c gets [\d.]+ requests/s to its 0\.00: .*\); "
                     r"now: .*to host memory", log), log[-3000:]
    assert "switch: c moves to the GPU tier (" in log and "; at its next park" in log, log[-3000:]
    assert not re.search(r"switch: c (deep-)?parked as asked.*to host memory", log), log[-3000:]
