"""The GPU budget with weights outside the engine (``engines/vllm/budget.py``), without vLLM:
the arithmetic against what vLLM itself logged, and why a start maps nothing, asked of a real daemon.

Run: pytest tests/test_vllm_budget.py
"""

from __future__ import annotations

from conftest import run_cli

from hotweights.engines.vllm.budget import cache_hint, engine_budget, fitting_utilization

GIB = 1 << 30
H200 = int(139.8 * GIB)


def test_mapped_weights_are_the_engines_own_and_only_the_rest_must_be_free():
    # 15.26 GiB held by the daemon: 124.5 GiB free, 0.92 x 139.8 = 128.6 GiB requested
    free, weights = H200 - int(15.3 * GIB), int(15.26 * GIB)
    engine, problem = engine_budget(total=H200, free=free, utilization=0.92, external=weights)
    assert problem == "" and engine == -(-H200 * 92 // 100) - weights
    # a disk start next to the same cache cannot fit, and says by how much
    engine, problem = engine_budget(total=H200, free=free, utilization=0.92, external=0)
    assert engine == 0 and problem.startswith("124.50 GiB is free but the engine needs 128.62 GiB")
    assert fitting_utilization(total=H200, free=free, external=0) == 0.88


def test_the_hint_says_why_a_start_maps_nothing_and_what_to_set():
    free = int(124.5 * GIB)
    disk = cache_hint(total=H200, free=free, held=int(15.26 * GIB), unmapped="this start reads the checkpoint "
                      "from disk", hotweights=False)
    assert disk == ("; the weight cache holds 15.26 GiB on this GPU and this start reads the checkpoint from disk: "
                    "start with --load-format hotweights (zero-copy weights count as this engine's), or "
                    "--gpu-memory-utilization 0.88, or `hotweights release`")
    # a hotweights start that maps nothing (here: a dtype the cache does not hold) is not told to use hotweights
    why = ("this start maps none of it (cached entry m [abc] differs: dtype: cached=bfloat16 "
           "requested=float16)")
    hint = cache_hint(total=H200, free=free, held=int(15.26 * GIB), unmapped=why, hotweights=True)
    assert "dtype: cached=bfloat16 requested=float16" in hint and "--load-format" not in hint
    assert hint.endswith("--gpu-memory-utilization 0.88, or `hotweights release`")


def test_budget_smaller_than_the_weights_is_refused():
    engine, problem = engine_budget(total=100 * GIB, free=100 * GIB, utilization=0.1, external=20 * GIB)
    assert engine == 0 and "exceed the --gpu-memory-utilization budget (0.1, 10.00 GiB)" in problem


def test_the_budget_reproduces_what_vllm_measured_on_an_h200():
    # vLLM 0.26, H200, 8B-shape bf16, --gpu-memory-utilization 0.92 (logs of the x2 session, 2026-11-30):
    # disk start: "Model loading took 15.26 GiB", "Available KV cache memory: 112.29 GiB";
    # warm start beside the daemon's 15.26 GiB: "GPU budget: 128.62 GiB ..., of which 15.26 GiB are the mapped
    # weights, 113.36 GiB for the engine's own allocations", "Available KV cache memory: 112.29 GiB"
    weights = int(15.26 * GIB)
    disk, _ = engine_budget(total=H200, free=H200, utilization=0.92, external=0)
    warm, problem = engine_budget(total=H200, free=H200 - weights, utilization=0.92, external=weights)
    assert problem == "" and round(disk / GIB, 2) == 128.62 and round(warm / GIB, 2) == 113.36
    activations = disk / GIB - 15.26 - 112.29  # what vLLM's profile left out of the disk start's KV cache
    assert abs((warm / GIB - 0.0 - activations) - 112.29) < 0.01  # the warm start's own KV cache, as vLLM logged it


def test_a_start_that_maps_nothing_is_told_why_by_the_real_daemon(models, daemon):
    from hotweights.client import connect_for
    from hotweights.config import AttachConfig
    from hotweights.engines.vllm.budget import _why_unmapped
    from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
    from hotweights.loading.diagnosis import Candidate

    sock = str(daemon.paths.directory)
    preloaded = run_cli("preload", "--model", str(models["tiny"]), "--dtype", "float32", "--socket-dir", sock)
    assert preloaded.returncode == 0, preloaded.stderr
    ckpt = open_checkpoint(models["tiny"])
    held = Candidate(checkpoint_key(ckpt, dtype="float32"), "checkpoint layout", evidence_mode="stream")
    wrong = Candidate(checkpoint_key(ckpt, dtype="float16"), "engine layout")
    lenient_config, strict_config = AttachConfig(socket_dir=sock), AttachConfig(socket_dir=sock, fallback=False)
    with connect_for(lenient_config) as client:
        streamed, refusal = _why_unmapped([held], [], lenient_config, client)
        assert refusal == "" and "the checkpoint layout entry is streamed into vLLM's loaders, a copy" in streamed
        lenient, refusal = _why_unmapped([wrong], [], lenient_config, client)
        assert refusal == "" and "dtype: cached=float32 requested=float16" in lenient and "load from disk" in lenient
        # strict, and no entry can serve it: the strict message with the diff and what to do, not a budget line
        _, refusal = _why_unmapped([wrong], [], strict_config, client)
        rows = client.status().rows()
    assert [r.num_attaches for r in rows] == [0]  # lookups: nothing mapped, no attach counted
    assert refusal.startswith("Weight cache unusable (cached entry tiny [") and "and fallback is disabled" in refusal
    assert "dtype: cached=float32 requested=float16" in refusal and "start with --dtype float32" in refusal
