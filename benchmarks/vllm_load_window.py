"""What fills vLLM's "Model loading took" window on a hotweights start.

One vLLM engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so its worker runs
here), started with ``--load-format hotweights`` on an entry the daemon already holds.
Around the model runner's ``load_model`` (the window vLLM's line reports) it records:

- the window's wall time, and vLLM's own "Model loading took" line;
- every garbage collection inside it (``gc.callbacks``): generation, objects, seconds;
  vLLM's ``DeviceMemoryProfiler`` calls ``gc.collect()`` as loading starts and twice as it ends;
- with ``--profile``, the functions with the most cumulative time (cProfile; it slows
  Python-heavy code, so read its shares, and the unprofiled window for the time).

The hotweights evidence lines (Mapped, Built) go to stderr as in any start.

Run: python benchmarks/vllm_load_window.py --model M --socket-dir D --device cuda --profile --json
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import logging
import os
import pstats
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

RUNNERS = ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.cpu_model_runner")


class _Collections:
    """gc.callbacks hook: one row per collection (generation, seconds, objects collected)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.rows.append({"at": self._start, "generation": info["generation"],
                              "seconds": time.perf_counter() - self._start, "collected": info["collected"]})


class _LoadLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "Model loading took" in msg:
            self.lines.append(msg)


def _wrap_runners(windows: list[dict], profile: bool) -> None:
    import importlib

    for name in RUNNERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for cls in vars(module).values():
            if isinstance(cls, type) and "load_model" in vars(cls) and cls.__module__ == name:
                original = cls.load_model

                def load_model(self, *args, _original=original, **kwargs):
                    prof = cProfile.Profile() if profile else None
                    start = time.perf_counter()
                    if prof:
                        prof.enable()
                    try:
                        return _original(self, *args, **kwargs)
                    finally:
                        if prof:
                            prof.disable()
                        windows.append({"start": start, "end": time.perf_counter(), "profile": prof})

                cls.load_model = load_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--socket-dir", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layout", default="engine")
    parser.add_argument("--mode", default="zero_copy")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.7)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    collections, lines, windows = _Collections(), _LoadLines(), []
    logging.getLogger("vllm").addHandler(lines)
    from vllm import LLM

    _wrap_runners(windows, args.profile)
    gc.callbacks.append(collections)
    extra = {"socket_dir": args.socket_dir, "fallback": False, "layout": args.layout, "mode": args.mode}
    kwargs = {"gpu_memory_utilization": args.gpu_memory_utilization} if args.device.startswith("cuda") else {}
    start = time.perf_counter()
    llm = LLM(model=args.model, load_format="hotweights", model_loader_extra_config=extra, max_model_len=512,
              enforce_eager=True, **kwargs)
    ready_s = time.perf_counter() - start
    gc.callbacks.remove(collections)
    answer = llm.generate(["The weight cache"], use_tqdm=False)[0].outputs[0].text
    window = windows[0]
    inside = [r for r in collections.rows if window["start"] <= r["at"] <= window["end"]]
    result = {"model": args.model, "device": args.device, "layout": args.layout, "mode": args.mode,
              "vllm_line": lines.lines[0] if lines.lines else None,
              "window_s": round(window["end"] - window["start"], 4), "profiled": args.profile,
              "gc_in_window": {"count": len(inside), "seconds": round(sum(r["seconds"] for r in inside), 4),
                               "full_collections": [round(r["seconds"], 4) for r in inside if r["generation"] == 2]},
              "gc_frozen_objects": gc.get_freeze_count(), "engine_ready_s": round(ready_s, 2), "answer": answer}
    if window["profile"] is not None:
        out = io.StringIO()
        stats = pstats.Stats(window["profile"], stream=out)
        stats.sort_stats("cumulative").print_stats(args.top)
        result["profile_top"] = [line for line in out.getvalue().splitlines() if line.strip()][-args.top - 1:]
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
