"""The grep-able lines, built and recognised in one place.

Users and ``hotweights verify`` grep for these exact shapes
(``Mapped|weight cache|falling back``); tests assert them character for character.
The patterns below are the only parsers of them (verify, ``preload --engine vllm``, the switch, benchmarks).
Change a shape only together with its pattern and the README section "Evidence lines".

Besides DESIGN's lines: the embedded server's ``startup:`` line and its parser (read by
verify, the report and ``benchmarks/serve_restart.py``), and the launcher's standby lines:
each is a line someone greps, so it lives beside the others. vLLM's own lines are read in
``verify/vllm_log.py``; what to *do* about a strict failure is ``loading.diagnosis``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30

PUBLISHED_RE = re.compile(r"Published (\d+) tensors \(([\d.]+) GiB\) to weight cache: (\S+) \[([0-9a-f]+)\] "
                          r"on (\S+)")
MAPPED_RE = re.compile(r"Mapped (\d+) tensors \(([\d.]+) GiB\) from weight cache daemon (\S+) "
                       r"\(mode=(\w+)\) in ([\d.]+) ms")
READY_MARK = "Weight cache daemon READY"
FALLBACK_MARK = "falling back to disk loading"
STRICT_MARK = "and fallback is disabled"
UNUSABLE_MARK = "Weight cache unusable"  # starts both the fallback line and the strict message
# how a write-through that did not publish begins its line (vLLM plugin and pool writer)
WT_PUBLISH_FAILED = "write-through publish failed"
WT_PUBLISH_REFUSED = "write-through publish refused"
WT_SKIPPED = "write-through skipped"
WRITE_THROUGH_FAILED = (WT_PUBLISH_FAILED, WT_PUBLISH_REFUSED, WT_SKIPPED)


def size_text(nbytes: int) -> str:
    """Bytes as a person reads them: GiB, MiB, or bytes (the unit ``--max-bytes 8G`` takes)."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.2f} {unit}"
    return f"{nbytes} bytes"


def is_evidence(line: str) -> bool:
    """A line that says what the cache did (the grep ``Mapped|weight cache|falling back``, any case), a park, or
    whether a vLLM start came from a warm standby."""
    return any(k in line for k in ("Mapped", "weight cache", "Weight cache", "falling back", "Parked ", "Woke ",
                                   "warm standby"))


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


STANDBY_USED_RE = re.compile(r"Started vLLM from a warm standby \(pid (\d+), imports saved ([\d.]+) s\)")
STANDBY_UNUSED_MARK = "No warm standby for this vLLM start"


def standby_used(pid: int, imports_s: float) -> str:
    return f"Started vLLM from a warm standby (pid {pid}, imports saved {imports_s:.1f} s)"


def standby_server(log_text: str) -> int:
    """The pid of the server a warm standby forked for this start, from the launcher's line; 0 if none."""
    handed = STANDBY_USED_RE.findall(log_text)
    return int(handed[-1][0]) if handed else 0


def standby_unused(reason: str) -> str:
    return f"{STANDBY_UNUSED_MARK} ({reason}); starting it plainly"


def falling_back(reason: str) -> str:
    return f"Weight cache unusable ({reason}); falling back to disk loading"


START_AND_PRELOAD = "start the daemon and preload the model (hotweights preload --model DIR)"


def strict_failure(reason: str, advice: str = START_AND_PRELOAD) -> str:
    return f"Weight cache unusable ({reason}) and fallback is disabled; {advice}, or set fallback to true"


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


def parse_startup(text: str) -> dict[str, Any] | None:
    """``{"phases": {phase: s}, "engine", "source", "ready_s"}`` of the last startup line in ``text``."""
    found = list(STARTUP_RE.finditer(text))
    if not found:
        return None
    m = found[-1]
    return {"phases": {k: float(m.group(k)) for k in STARTUP_PHASES}, "engine": m.group("engine"),
            "source": m.group("source"), "ready_s": float(m.group("ready"))}


# a parked engine (serve/park.py): when it sleeps and when it wakes
PARKED_RE = re.compile(r"Parked (\S+) \(level (\d)\): freed ([\d.]+) GiB in ([\d.]+) s \((weights kept mapped|"
                       r"weights unmapped)\)")
WOKE_RE = re.compile(r"Woke (\S+) in ([\d.]+) s \(weights (kept mapped|from [\w+]+)(?:, ([^)]*))?\)")


# a wake refused (the engine stays parked): by vLLM's workers for memory, by the embedded server when its
# weights cannot be found again; the switch and the parked front tell them apart by these
CANNOT_WAKE_MARK = "cannot wake"
NO_ROOM_RE = re.compile(r"cannot wake (\S+): it needs ([\d.]+) GiB back on its GPU but ([\d.]+) GiB is free")


@dataclass(frozen=True, slots=True)
class WakeRefusal:
    """An engine's own line saying why it would not wake (``hotweights: cannot wake ...``), and whether that was for
    memory (its GPU lacks room: parking another engine may let it wake)."""

    reason: str
    for_memory: bool


def wake_refusal(text: str) -> WakeRefusal | None:
    """The last wake refusal in an engine's log ``text``, None where it wrote none (vLLM's server answers a failed
    wake with a bare 500: the reason is only in its log)."""
    lines = [x for x in text.splitlines() if f"hotweights: {CANNOT_WAKE_MARK}" in x]
    if not lines:
        return None
    line = lines[-1]
    return WakeRefusal(line[line.index("hotweights: ") + len("hotweights: "):].strip(), bool(NO_ROOM_RE.search(line)))


def cannot_wake_no_room(name: str, need_bytes: int, free_bytes: int) -> str:
    return (f"cannot wake {name}: it needs {need_bytes / GIB:.2f} GiB back on its GPU but {free_bytes / GIB:.2f} GiB "
            f"is free; park or stop another engine first (nothing was changed: it stays parked)")


def woke_source(text: str) -> str | None:
    """Where the weights of the last wake in ``text`` came from (``gpu``, ``host``, ``disk``), None when they
    stayed mapped or no wake is in it."""
    found = list(WOKE_RE.finditer(text))
    kept = not found or found[-1].group(3) == "kept mapped"
    return None if kept else found[-1].group(3).removeprefix("from ")


def parked(model: str, level: int, freed_bytes: int, seconds: float, *, weights_mapped: bool) -> str:
    return (f"Parked {model} (level {level}): freed {freed_bytes / GIB:.2f} GiB in {seconds:.3f} s "
            f"({'weights kept mapped' if weights_mapped else 'weights unmapped'})")


def woke(model: str, seconds: float, source: str | None, rate: str = "") -> str:
    """``source``: where the weights came from (gpu, host, disk), None when they stayed mapped; ``rate``: a host
    copy's bytes and speed (``16.40 GB at 47.1 GB/s``), said after it."""
    weights = "weights kept mapped" if source is None else f"weights from {source}"
    return f"Woke {model} in {seconds:.3f} s ({weights}{', ' + rate if rate else ''})"


# the switch's line for each switch (``hotweights switch``): its time, where the weights came from, and what it
# waited for: how long its longest-waiting request had waited when the switch began (for busy engines to leave), and
# each engine it parked first
SWITCH_AWAKE_RE = re.compile(r"switch: (\S+) awake in ([\d.]+) s \(weights (\w+)(?:; (.*))?\)")


def switch_awake(model: str, seconds: float, source: str, parked: list[tuple[str, float, bool]], wake_s: float,
                 waited_s: float = 0.0) -> str:
    """``parked``: ``(model, seconds, whether it parked)`` of each engine parked first (or stopped: an engine that
    does not park); ``waited_s``: how long the model's longest-waiting request had waited before the switch began.
    A model whose weights come from a ``start`` or ``restart`` was started, not woken."""
    said = [f"its requests waited {waited_s:.3f} s"] if waited_s >= 0.001 else []
    said += [f"{'parked' if did else 'stopped'} {name} in {park:.3f} s" for name, park, did in parked]
    said += [f"{'started' if source in ('start', 'restart') else 'woke'} {model} in {wake_s:.3f} s"] if said else []
    return f"switch: {model} awake in {seconds:.3f} s (weights {source}" + "".join(f"; {x}" for x in said) + ")"
