"""Reading vLLM's own log: where the time of a vLLM start went, and its weight clock.

vLLM logs ``LEVEL MM-DD HH:MM:SS [file:line] message`` (whole seconds), prefixed with its
process (``(APIServer pid=N)``, ``(EngineCore pid=N)``, ``(Worker_TP0 pid=N)``) once those
exist, and gives some durations in words. ``phases`` splits a start, from the moment its
command ran to its first ``/health`` 200, into:

- ``imports``: to vLLM's first line (the API server's imports; nearly none from a standby);
- ``engine_start``: to the engine core's first line (its process start: a fresh interpreter
  importing vLLM again when vLLM spawns it);
- ``workers_start``: from there to the first worker's line, with TP > 1 (the workers are processes
  of their own, spawned or forked by the engine core; with TP = 1 the worker is the engine core);
- ``weights``: vLLM's "Model loading took" (the slowest rank);
- ``compile``: "torch.compile took ... in total" (a cache hit loads; a miss compiles);
- ``cuda_graphs``: "Graph capturing finished in";
- ``engine_rest``: the rest of "init engine" (profiling, KV cache, warm-up);
- ``api``: from then to ready.

A phase with no line is 0 (an eager start has no compile and no graphs). Timestamps are whole
seconds, so each phase is good to about a second; the phases add up to ``ready_s``.

``facts`` reads the rest a benchmark or a check compares between starts: vLLM's weight clock, the
KV cache it got (GiB and tokens, GPU or CPU build), whether it compiled afresh, and the evidence of
the cache (mapped, fallen back).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

VLLM_PHASES = ("imports", "engine_start", "workers_start", "weights", "compile", "cuda_graphs", "engine_rest", "api")
LINE_RE = re.compile(r"^(?:\((?P<proc>\w+)(?: pid=\d+)?\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                     r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) \[")
# vLLM's own weight clock (its model runner; 0.26 and 0.32 word it differently), one line per worker
VLLM_LOADING_RE = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) s")
COMPILE_RE = re.compile(r"torch\.compile t(?:ook|akes) ([\d.]+) s in total")
GRAPHS_RE = re.compile(r"Graph capturing finished in ([\d.]+) secs?")
INIT_ENGINE = "init engine (profile, create kv cache, warmup model) took"
KV_GIB_RE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
KV_TOKENS_RE = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
COMPILATION_RE = re.compile(r"init engine .* took [\d.]+ s \(compilation: ([\d.]+) s\)")
COMPILED_MARK = "Compiling a graph for"  # vLLM compiled afresh instead of loading its compile cache


def facts(text: str) -> dict[str, Any]:
    """What a vLLM start's log says of it (None where it has no line): ``weights_s`` and
    ``model_loading_gib`` (the slowest worker's "Model loading took"), ``kv_cache_gib``,
    ``kv_cache_tokens``, ``compiled`` (afresh: a start that compiled is not a restart) and ``compile_s``,
    ``mapped`` (an attach line) and ``fallback`` (a fallback line)."""
    loading = max(VLLM_LOADING_RE.finditer(text), key=lambda m: float(m.group(2)), default=None)
    kv_gib, kv_tokens, compilation = KV_GIB_RE.search(text), KV_TOKENS_RE.search(text), COMPILATION_RE.search(text)
    return {"weights_s": float(loading.group(2)) if loading else None,
            "model_loading_gib": float(loading.group(1)) if loading else None,
            "kv_cache_gib": float(kv_gib.group(1)) if kv_gib else None,
            "kv_cache_tokens": int(kv_tokens.group(1).replace(",", "")) if kv_tokens else None,
            "compiled": COMPILED_MARK in text, "compile_s": float(compilation.group(1)) if compilation else None,
            "mapped": "Mapped " in text, "fallback": "falling back" in text}


def vllm_weights_s(text: str) -> float | None:
    """The slowest worker's ``Model loading took`` seconds in a vLLM log (the start waits for it)."""
    found = [float(m.group(2)) for m in VLLM_LOADING_RE.finditer(text)]
    return max(found) if found else None


def phases(text: str, started_utc: str, ready_s: float) -> dict[str, float] | None:
    """Seconds per phase of the start whose log is ``text`` (its command ran at ``started_utc``, ISO 8601;
    vLLM logs local time); None when the log has no vLLM line."""
    started = datetime.fromisoformat(started_utc).astimezone().replace(tzinfo=None)
    first = engine = worker = init_done = None
    durations = {"weights": 0.0, "compile": 0.0, "cuda_graphs": 0.0}
    for line in text.splitlines():
        m = LINE_RE.match(line)
        if not m:
            continue
        at = (datetime.strptime(f"{started.year}-{m.group('ts')}", "%Y-%m-%d %H:%M:%S") - started).total_seconds()
        first = at if first is None else first
        proc = m.group("proc") or ""
        if engine is None and proc.startswith(("EngineCore", "Worker")):
            engine = at
        if worker is None and proc.startswith("Worker"):
            worker = at
        for phase, rx in (("weights", VLLM_LOADING_RE), ("compile", COMPILE_RE), ("cuda_graphs", GRAPHS_RE)):
            if found := rx.search(line):
                durations[phase] = max(durations[phase], float(found.group(rx.groups)))
        if INIT_ENGINE in line:
            init_done = at
    if first is None:
        return None
    engine = first if engine is None else engine
    worker = engine if worker is None else worker
    init_done = ready_s if init_done is None else init_done
    spent = sum(durations.values())
    out = {"imports": first, "engine_start": engine - first, "workers_start": worker - engine, **durations,
           "engine_rest": init_done - worker - spent, "api": ready_s - init_done}
    return {k: round(max(0.0, out[k]), 2) for k in VLLM_PHASES}
