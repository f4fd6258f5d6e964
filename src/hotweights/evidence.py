"""The evidence lines of DESIGN.md, built and recognised in one place.

Users and ``hotweights verify`` grep for these exact shapes
(``Mapped|weight cache|falling back``); tests assert them character for character.
The patterns below are the only parsers of them (verify, ``preload --engine vllm``).
Change a shape only together with its pattern and the README section "Evidence lines".
"""

from __future__ import annotations

import re

GIB = 1 << 30

PUBLISHED_RE = re.compile(r"Published (\d+) tensors \(([\d.]+) GiB\) to weight cache: (\S+) \[([0-9a-f]+)\] "
                          r"on (\S+)")
MAPPED_RE = re.compile(r"Mapped (\d+) tensors \(([\d.]+) GiB\) from weight cache daemon (\S+) "
                       r"\(mode=(\w+)\) in ([\d.]+) ms")
READY_MARK = "Weight cache daemon READY"
FALLBACK_MARK = "falling back to disk loading"
STRICT_MARK = "and fallback is disabled"
# lines of a write-through that did not publish (vLLM plugin and policy)
WRITE_THROUGH_FAILED = ("write-through publish failed", "write-through publish refused", "write-through skipped")


def daemon_ready(socket_path: str, pid: int) -> str:
    return f"Weight cache daemon READY: socket={socket_path} pid={pid}"


def published(num_tensors: int, nbytes: int, model: str, key_short: str, device: str, seconds: float) -> str:
    return (
        f"Published {num_tensors} tensors ({nbytes / GIB:.2f} GiB) to weight cache: "
        f"{model} [{key_short}] on {device} in {seconds:.2f} s"
    )


def mapped(num_tensors: int, nbytes: int, socket_path: str, mode: str, ms: float) -> str:
    return (
        f"Mapped {num_tensors} tensors ({nbytes / GIB:.2f} GiB) from weight cache daemon "
        f"{socket_path} (mode={mode}) in {ms:.1f} ms"
    )


def falling_back(reason: str) -> str:
    return f"Weight cache unusable ({reason}); falling back to disk loading"


START_AND_PRELOAD = "start the daemon and preload the model (hotweights preload --model DIR)"


def strict_failure(reason: str, advice: str = START_AND_PRELOAD) -> str:
    return f"Weight cache unusable ({reason}) and fallback is disabled; {advice}, or set fallback to true"


def advice_for(outcome: str, diffs: tuple[str, ...] | list[str] = ()) -> str:
    """What to do about a strict failure, by what the attach came to."""
    if outcome == "miss":
        return "preload the model (hotweights preload --model DIR)"
    for line in diffs:
        if line.startswith("dtype: cached="):
            cached, requested = line.removeprefix("dtype: cached=").split(" requested=")
            return (f"the cache holds this model as {cached}: start with --dtype {cached}, or preload "
                    f"{requested} too (hotweights preload --model DIR --dtype {requested})")
    if outcome == "mismatch":
        return "preload the model as this engine loads it (see the differing fields)"
    return START_AND_PRELOAD


# the embedded server's startup line: every phase from process start (serve/app.py)
STARTUP_PHASES = ("imports", "tokenizer", "cuda_context", "model_build", "weights", "warmup", "listening")
STARTUP_RE = re.compile(r"startup: imports=(?P<imports>[\d.]+)s tokenizer=(?P<tokenizer>[\d.]+)s "
                        r"cuda_context=(?P<cuda_context>[\d.]+)s model_build=(?P<model_build>[\d.]+)s "
                        r"\(engine=(?P<engine>\w+)\) weights=(?P<weights>[\d.]+)s \(source=(?P<source>[\w+]+)\) "
                        r"warmup=(?P<warmup>[\d.]+)s listening=(?P<listening>[\d.]+)s ready=(?P<ready>[\d.]+)s")


def startup(phases: dict[str, float], *, engine: str, source: str, ready_s: float) -> str:
    p = phases
    return (f"startup: imports={p['imports']:.2f}s tokenizer={p['tokenizer']:.2f}s "
            f"cuda_context={p['cuda_context']:.2f}s model_build={p['model_build']:.2f}s (engine={engine}) "
            f"weights={p['weights']:.3f}s (source={source}) warmup={p['warmup']:.2f}s "
            f"listening={p['listening']:.2f}s ready={ready_s:.2f}s (from process start)")


def parse_startup(text: str) -> dict | None:
    """``{"phases": {phase: s}, "engine", "source", "ready_s"}`` of the last startup line in ``text``."""
    found = list(STARTUP_RE.finditer(text))
    if not found:
        return None
    m = found[-1]
    return {"phases": {k: float(m.group(k)) for k in STARTUP_PHASES}, "engine": m.group("engine"),
            "source": m.group("source"), "ready_s": float(m.group("ready"))}


# vLLM's own weight clock (its model runner; 0.26 and 0.32 word it differently), one line per worker
VLLM_LOADING_RE = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) s")


def vllm_weights_s(text: str) -> float | None:
    """The slowest worker's ``Model loading took`` seconds in a vLLM log (the start waits for it)."""
    found = [float(m.group(2)) for m in VLLM_LOADING_RE.finditer(text)]
    return max(found) if found else None
