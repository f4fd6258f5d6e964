#!/usr/bin/env python3
"""The daemon's side of an attach, interleaved across daemons built from different source trees (before /
after a change) and flags: the round trip of one attach request (reply + fds, nothing mapped) on one
open connection, median per round, rounds interleaved (shuffled order in each).

Run: .venv/bin/python benchmarks/daemon_attach_rtt.py --model M --daemon before=OLD/src \\
        --daemon after=src --daemon after+metrics=src:--metrics-port=0 --rounds 11 --json
(``--metrics-port=0`` is replaced by a free port.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hotweights.client import connect
from hotweights.loading.preload import preload
from hotweights.observe import free_port
from hotweights.paths import DaemonPaths
from hotweights.wire import close_fds


def start(src: str, flags: list[str]) -> tuple[subprocess.Popen, DaemonPaths]:
    sock = Path(tempfile.mkdtemp(prefix="hw-rtt-", dir="/tmp"))
    flags = [f"--metrics-port={free_port()}" if f == "--metrics-port=0" else f for f in flags]
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    proc = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", str(sock), *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    paths = DaemonPaths(sock)
    for _ in range(400):
        try:
            connect(paths).close()
            return proc, paths
        except Exception:
            time.sleep(0.025)
    raise SystemExit(f"daemon from {src} did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--daemon", action="append", required=True, help="LABEL=SRC[:FLAG,...]")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    daemons = {}
    for spec in args.daemon:
        label, rest = spec.split("=", 1)
        src, _, flags = rest.partition(":")
        proc, paths = start(src, [f for f in flags.split(",") if f])
        key = preload(args.model, socket_dir=str(paths.directory)).key
        daemons[label] = (proc, paths, key)
    medians: dict[str, list[float]] = {label: [] for label in daemons}
    try:
        for rnd in range(args.rounds):
            order = list(daemons.items())
            random.Random(rnd).shuffle(order)  # no daemon always first in a round
            for label, (_, paths, key) in order:
                with connect(paths) as client:
                    times = []
                    for _ in range(args.requests):
                        t = time.perf_counter()
                        reply = client.attach(key)
                        times.append(time.perf_counter() - t)
                        close_fds(reply.take_fds())
                medians[label].append(statistics.median(times) * 1e6)
    finally:
        for proc, _, _ in daemons.values():
            proc.terminate()
            proc.wait(10)
    first = next(iter(medians))
    out = {"unit": "microseconds, median per round", "rounds": medians,
           "median": {k: round(statistics.median(v), 1) for k, v in medians.items()},
           "ratio_to_" + first: {k: round(statistics.median(v) / statistics.median(medians[first]), 3)
                                 for k, v in medians.items()}, "argv": sys.argv[1:]}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
