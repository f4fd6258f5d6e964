"""Where a switch's time went over a window of its front's log, per model: its wakes and what each took, its turns
(awake to its leave), its leaves and how long its park waited for them, the streams each leave held or paused, and
(vLLM engines, from their own logs) the tokens/s each engine generated and how many requests it ran. Issue 69: on an
H100 these numbers, read by hand, showed a host-tier turn of 0.8 s moving a held stream 6-12 tokens while the
GPU-tier engines awake beside it took the GPU's time; ``switch_trace.py`` now adds them to every run (``turns``).

Run: python benchmarks/switch_turns.py FRONT_LOG [--engine-logs DIR] [--since "2026-12-06 14:16:00"] [--until ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

STAMP = "%Y-%m-%d %H:%M:%S"
FRONT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ \S+ switch: (.*)$")
AWAKE = re.compile(r"^(\S+) awake in ([0-9.]+) s")
LEAVES = re.compile(r"^(\S+) leaves for \S+: (\d+) request\(s\) in flight end first(?: \((\d+) (?:held|paused))?")
PARKED = re.compile(r"^(\S+) (?:deep-)?parked for ")
# vLLM's own periodic line: "(APIServer pid=N) INFO 12-06 14:25:27 [loggers.py:310] Engine 000: Avg prompt
# throughput: 314.4 tokens/s, Avg generation throughput: 52.8 tokens/s, Running: 12 reqs, ..."
VLLM = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) .*Avg generation throughput: ([0-9.]+) tokens/s, Running: (\d+)")


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def front_turns(text: str, since: datetime.datetime | None = None,
                until: datetime.datetime | None = None) -> dict[str, dict]:
    """Per model, from the front's log lines between ``since`` and ``until``: wakes, turns, leaves."""
    awake_at: dict[str, datetime.datetime] = {}
    leaving_at: dict[str, datetime.datetime] = {}
    seen: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in text.splitlines():
        m = FRONT.match(line)
        if not m:
            continue
        at = datetime.datetime.strptime(m[1], STAMP) + datetime.timedelta(milliseconds=int(m[2]))
        if (since and at < since) or (until and at > until):
            continue
        what = m[3]
        if woke := AWAKE.match(what):
            awake_at[woke[1]] = at
            seen[woke[1]]["wake_s"].append(float(woke[2]))
        elif left := LEAVES.match(what):
            name = left[1]
            if name in awake_at:
                seen[name]["turn_s"].append((at - awake_at.pop(name)).total_seconds())
            leaving_at[name] = at
            seen[name]["streams_asked"].append(float(left[3] or 0))
        elif (parked := PARKED.match(what)) and parked[1] in leaving_at:
            seen[parked[1]]["leave_to_parked_s"].append((at - leaving_at.pop(parked[1])).total_seconds())
    return {name: {"wakes": len(got["wake_s"]), "wake_s": _median(got["wake_s"]),
                   "leaves": len(got["streams_asked"]), "turn_s": _median(got["turn_s"]),
                   "leave_to_parked_s": _median(got["leave_to_parked_s"]),
                   "streams_asked_per_leave": _median(got["streams_asked"])}
            for name, got in sorted(seen.items())}


def engine_rates(text: str, since: datetime.datetime | None = None,
                 until: datetime.datetime | None = None) -> dict | None:
    """From a vLLM engine's log between ``since`` and ``until`` (its lines carry no year: ``since``'s, else this
    one): the median of its generation tokens/s and of the requests it ran, over its periodic lines; None where it
    has none (the embedded engine)."""
    year = (since or datetime.datetime.now()).year
    rates, running = [], []
    for line in text.splitlines():
        m = VLLM.search(line)
        if not m:
            continue
        at = datetime.datetime.strptime(f"{year}-{m[1]}", "%Y-%m-%d %H:%M:%S")
        if (since and at < since) or (until and at > until):
            continue
        rates.append(float(m[2]))
        running.append(float(m[3]))
    if not rates:
        return None
    return {"lines": len(rates), "generation_tokens_s": _median(rates), "running": _median(running)}


def turns(front_log: str, engine_logs: dict[str, str], since: datetime.datetime | None = None,
          until: datetime.datetime | None = None) -> dict[str, dict]:
    """``front_turns`` per model, with its engine's ``engine_rates`` where its log has them."""
    out = front_turns(front_log, since, until)
    for name, text in engine_logs.items():
        rates = engine_rates(text, since, until)
        if rates:
            out.setdefault(name, {})["engine"] = rates
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("front_log", type=Path)
    parser.add_argument("--engine-logs", type=Path, help="the front's --log-dir: NAME.log per engine")
    parser.add_argument("--since", help=f"from this time of the front's log ({STAMP})")
    parser.add_argument("--until", help=f"to this time ({STAMP})")
    args = parser.parse_args()
    since = datetime.datetime.strptime(args.since, STAMP) if args.since else None
    until = datetime.datetime.strptime(args.until, STAMP) if args.until else None
    logs = {p.stem: p.read_text(errors="replace") for p in sorted(args.engine_logs.glob("*.log"))} \
        if args.engine_logs else {}
    print(json.dumps(turns(args.front_log.read_text(errors="replace"), logs, since, until), indent=1))


if __name__ == "__main__":
    main()
