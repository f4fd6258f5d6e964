"""Where a vLLM start's time went, read from vLLM's own log (``verify/vllm_log.py``).

The log lines are those of a real start (vLLM 0.26.0, H200, 8B, CUDA graphs on, engine layout
mapped zero-copy), shortened. Run: pytest tests/test_vllm_log.py
"""

from __future__ import annotations

from datetime import datetime

from hotweights.verify.vllm_log import VLLM_PHASES, facts, phases, vllm_weights_s

H200_START = """\
INFO 11-30 14:55:56 [__init__.py:112] Registered model loader `HotweightsModelLoader` with load format `hotweights`
(APIServer pid=6011) INFO 11-30 14:55:56 [api_utils.py:273] non-default args: {'port': 34401}
(EngineCore pid=62) INFO 11-30 14:56:22 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: ...
(EngineCore pid=62) INFO 11-30 14:56:24 [model_runner.py:305] Model loading took 0.0 GiB and 0.678672 seconds
(EngineCore pid=62) INFO 11-30 14:56:31 [monitor.py:53] torch.compile took 6.75 s in total
(EngineCore pid=62) Capturing CUDA graphs (PIECEWISE):   0%|          | 0/51 [00:00<?, ?it/s]
(EngineCore pid=62) INFO 11-30 14:56:39 [model_runner.py:747] Graph capturing finished in 7 secs, took 1.01 GiB
(EngineCore pid=62) INFO 11-30 14:56:39 [core.py:340] init engine (profile, create kv cache, warmup model) took 15.38 s
(APIServer pid=6011) INFO 11-30 14:56:40 [api_server.py:677] Starting vLLM server on http://0.0.0.0:34401
"""
START = datetime(2026, 11, 30, 14, 55, 30).astimezone().isoformat()  # when the command ran


def test_a_start_splits_into_phases_that_add_up_to_its_ready_time():
    got = phases(H200_START, START, ready_s=71.0)
    assert list(got) == list(VLLM_PHASES)
    assert got == {"imports": 26.0, "engine_start": 26.0, "workers_start": 0.0, "weights": 0.68, "compile": 6.75,
                   "cuda_graphs": 7.0, "engine_rest": 2.57, "api": 2.0}
    assert abs(sum(got.values()) - 71.0) < 0.01


def test_an_eager_start_has_no_compile_and_no_graphs_and_no_vllm_line_is_no_phases():
    eager = "\n".join(line for line in H200_START.splitlines() if "compile" not in line and "Graph" not in line)
    got = phases(eager, START, ready_s=71.0)
    assert got["compile"] == 0.0 and got["cuda_graphs"] == 0.0 and got["engine_rest"] == 16.32
    assert phases("Traceback (most recent call last):", START, ready_s=1.0) is None


def test_tp_workers_that_start_as_processes_of_their_own_are_a_phase_of_their_own():
    tp2 = H200_START.replace("(EngineCore pid=62) INFO 11-30 14:56:24", "(Worker_TP0 pid=63) INFO 11-30 14:56:24")
    tp2 = tp2.replace("INFO 11-30 14:56:22 [core.py:116]", "INFO 11-30 14:56:05 [core.py:116]")
    got = phases(tp2, START, ready_s=71.0)
    assert got["engine_start"] == 9.0 and got["workers_start"] == 19.0 and got["engine_rest"] == 0.57
    assert abs(sum(got.values()) - 71.0) < 0.01


def test_vllms_weight_clock_is_read_in_both_wordings_and_the_slowest_rank_counts():
    log = ("(Worker_TP0 pid=1) INFO [model_runner.py:305] Model loading took 7.63 GiB and 0.244372 seconds\n"
           "(Worker_TP1 pid=2) INFO [gpu_model_runner.py:5348] Model loading took 7.63 GiB memory and 0.31 seconds\n")
    assert vllm_weights_s(log) == 0.31
    assert vllm_weights_s("no such line") is None


def test_the_facts_of_a_start_are_read_from_one_place():
    log = H200_START + ("(EngineCore pid=62) INFO 11-30 14:56:33 [gpu_worker.py:1] Available KV cache memory: "
                        "91.16 GiB\n(EngineCore pid=62) INFO 11-30 14:56:33 [kv_cache_utils.py:1] GPU KV cache size: "
                        "746,864 tokens\nINFO [hotweights] Mapped 399 tensors (15.26 GiB) from weight cache daemon x\n")
    got = facts(log)
    assert got == {"weights_s": 0.678672, "model_loading_gib": 0.0, "kv_cache_gib": 91.16, "kv_cache_tokens": 746864,
                   "compiled": False, "compile_s": None, "mapped": True, "fallback": False}
    cpu = facts("INFO CPU KV cache size: 12,288 tokens\nCompiling a graph for dynamic shape\n")
    assert cpu["kv_cache_tokens"] == 12288 and cpu["compiled"] and cpu["weights_s"] is None


def test_a_sampled_warm_up_names_what_took_the_time_after_graph_capture(caplog):
    """``HOTWEIGHTS_PROFILE_START=1``'s sampler: the stacks after the last sample inside ``capture_model`` are the
    post-capture ones, and the costliest is named with its seconds."""
    import logging
    import time

    from hotweights.engines.vllm import startprofile

    def capture_model() -> None:
        time.sleep(0.5)

    def sampler_warm_up() -> None:
        time.sleep(1.0)

    def compile_or_warm_up_model(worker: object) -> str:
        capture_model()
        sampler_warm_up()
        return "times"

    with caplog.at_level(logging.INFO, logger="hotweights.engines.vllm.startprofile"):
        assert startprofile.sampled(compile_or_warm_up_model, object(), "m0") == "times"
    (record,) = [r for r in caplog.records if "warm-up of m0" in r.getMessage()]
    after, whole = record.getMessage().split("after graph capture, ")[1].split("the whole warm-up:")
    seconds = float(after.split(" s:")[0])
    assert 0.6 <= seconds <= 1.4 and "sampler_warm_up" in after.splitlines()[1], after
    assert "capture_model" not in after and "capture_model" in whole


def test_the_warm_up_hook_wraps_once_puts_tritons_cache_back_and_samples_where_asked(caplog, monkeypatch):
    """vLLM's compile points ``TRITON_CACHE_DIR`` into its compile cache and leaves it there: the warm-up after it
    (the sampler's Triton kernels) goes back to the engine's own, which the starts that load compiled code read."""
    import logging
    import os
    import types

    from hotweights.engines.vllm.patches import install_warm_up

    seen: list[str | None] = []

    class Worker:
        vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name="m3"))

        def compile_or_warm_up_model(self) -> int:
            seen.append(os.environ.get("TRITON_CACHE_DIR"))
            return 7

    worker = types.ModuleType("worker")
    worker.Worker = Worker  # type: ignore[attr-defined]
    monkeypatch.setenv("TRITON_CACHE_DIR", "/node/triton")
    monkeypatch.setenv("HOTWEIGHTS_PROFILE_START", "1")
    assert install_warm_up(worker) and not install_warm_up(worker)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/cache/vllm/torch_compile_cache/x/triton_cache")  # vLLM's compile
    with caplog.at_level(logging.INFO, logger="hotweights.engines.vllm"):
        assert Worker().compile_or_warm_up_model() == 7
    assert seen == ["/node/triton"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("vLLM's warm-up of m3" in m for m in messages)  # sampled
    assert any("m3's warm-up JIT-compiles its sampler's Triton kernels into /node/triton" in m for m in messages)

    class Plain:
        def compile_or_warm_up_model(self) -> None:
            seen.append(os.environ.get("TRITON_CACHE_DIR"))

    unset = types.ModuleType("worker")
    unset.Worker = Plain  # type: ignore[attr-defined]
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.delenv("HOTWEIGHTS_PROFILE_START")
    assert install_warm_up(unset)
    unset.Worker().compile_or_warm_up_model()  # nothing moved it: nothing to put back
    monkeypatch.setenv("TRITON_CACHE_DIR", "/cache/x/triton_cache")
    unset.Worker().compile_or_warm_up_model()
    assert seen[1:] == [None, None] and "TRITON_CACHE_DIR" not in os.environ  # unset, as the engine had it


def test_a_wake_puts_back_the_buffers_vllms_sleep_kept_with_one_wait_and_keeps_them_if_it_fails():
    """vLLM's level-2 wake copies each buffer its sleep kept back with a blocking copy (145 waits for an 8B);
    ``park.wake_up`` takes them from vLLM, lets it wake the rest, then copies all back and waits once. A wake
    that fails leaves them to vLLM for the next one, and a wake of the KV cache alone for the weights' wake."""
    import types

    import torch

    from hotweights.engines.vllm import park

    model = torch.nn.Module()
    model.register_buffer("scale", torch.zeros(1))
    model.register_buffer("cos_sin", torch.zeros(4, 2))
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name="m0", model="m0"),
                                   parallel_config=types.SimpleNamespace(world_size=1))
    worker = types.SimpleNamespace(vllm_config=config, model_runner=types.SimpleNamespace(model=model),
                                   _sleep_saved_buffers={"scale": torch.tensor([0.5]),
                                                         "cos_sin": torch.arange(8.0).reshape(4, 2)})
    kept = dict(worker._sleep_saved_buffers)
    saw: list[dict] = []

    def failing(w: object, tags: object) -> None:
        saw.append(dict(worker._sleep_saved_buffers))
        raise RuntimeError("no room")

    try:
        park.wake_up(worker, failing, None)
    except RuntimeError:
        pass
    assert saw == [{}] and worker._sleep_saved_buffers.keys() == kept.keys()  # vLLM restored none; kept for later
    assert float(model.scale) == 0.0

    def wakes(w: object, tags: object) -> str:
        saw.append(dict(worker._sleep_saved_buffers))  # vLLM's own loop finds nothing to copy
        return "woken"

    assert park.wake_up(worker, wakes, ["kv_cache"]) == "woken"  # the weights' memory still asleep: not yet
    assert saw[-1] == {} and worker._sleep_saved_buffers.keys() == kept.keys() and float(model.scale) == 0.0
    assert park.wake_up(worker, wakes, ["weights"]) == "woken"
    assert saw[-1] == {} and worker._sleep_saved_buffers == {}
    assert torch.equal(model.scale, kept["scale"]) and torch.equal(model.cos_sin, kept["cos_sin"])
