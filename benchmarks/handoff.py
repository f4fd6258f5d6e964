#!/usr/bin/env python3
"""``hotweights daemon --replace`` timed: how long attaches wait while the cache changes daemons.

One daemon holds the model; a thread attaches it over and over (fresh connection each time, as an
engine start does); the daemon is replaced ``--repeat`` times. Prints, side by side: attach times in
steady state and during each hand-off (median, max), each hand-off's own duration (from its log
line), and whether any attach failed (it must not).

Run: .venv/bin/python benchmarks/handoff.py --model demo/model --repeat 5 --json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.preload import preload

TOOK = re.compile(r"hand-off: took (\d+) entries from pid \d+ \(hotweights [^)]*\) in ([\d.]+) s")


def status(sock: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "hotweights", "status", "--json", "--socket-dir", sock],
                       capture_output=True, text=True)
    return json.loads(r.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sock = tempfile.mkdtemp(prefix="hw-handoff-", dir="/tmp")
    log = Path(sock) / "replacements.log"
    daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not status(sock).get("running"):
        time.sleep(0.05)
    key = preload(args.model, socket_dir=sock).key
    config = AttachConfig(socket_dir=sock, fallback=False)
    samples: list[tuple[float, float, str]] = []  # (start, seconds, outcome)
    stop = threading.Event()

    def attach_forever() -> None:
        while not stop.is_set():
            t = time.monotonic()
            outcome = attach_tensors(key, config).outcome.value
            samples.append((t, time.monotonic() - t, outcome))

    worker = threading.Thread(target=attach_forever)
    worker.start()
    windows, took = [], []
    procs = [daemon]
    try:
        time.sleep(1.0)  # steady state first
        for _ in range(args.repeat):
            begin = time.monotonic()
            with open(log, "ab") as out:
                new = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--replace", "--socket-dir",
                                        sock], stdout=out, stderr=subprocess.STDOUT)
            procs.append(new)
            procs[-2].wait(60)
            while status(sock).get("pid") != new.pid:
                time.sleep(0.01)
            windows.append((begin, time.monotonic()))
            time.sleep(1.0)
    finally:
        stop.set()
        worker.join()
        for p in procs:
            p.terminate()
            p.wait(10)
    took = [float(m.group(2)) for m in TOOK.finditer(log.read_text())]
    during = [s for t, s, _ in samples if any(a <= t <= b for a, b in windows)]
    steady = [s for t, s, _ in samples if not any(a - 0.1 <= t <= b + 0.1 for a, b in windows)]
    result = {
        "model": args.model.name, "replacements": args.repeat, "attaches": len(samples),
        "failed": sum(o != "ok" for _, _, o in samples),
        "steady_ms": {"median": round(statistics.median(steady) * 1e3, 2), "max": round(max(steady) * 1e3, 2)},
        "during_handoff_ms": {"n": len(during), "median": round(statistics.median(during) * 1e3, 2) if during else None,
                              "max": round(max(during) * 1e3, 2) if during else None},
        "handoff_s": {"median": round(statistics.median(took), 3) if took else None, "runs": took},
        "argv": sys.argv[1:],
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
