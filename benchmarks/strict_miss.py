#!/usr/bin/env python3
"""How fast a strict start fails: ``hotweights generate`` with ``{"fallback": false}`` and no daemon, or a
hung one (a socket that accepts and never answers), from process start to its exit.

Interleaved runs in fresh processes, medians of ``--repeat``; beside them the floor: a fresh ``python -c
"import torch"`` (the engine process imports torch before it can map anything). Prints one JSON line with
the medians and each case's time over the floor.

Run: python benchmarks/strict_miss.py --repeat 5 --json [--before /tmp/base/src]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hotweights.demo_model import write_demo_model


def timed(cmd: list[str], env: dict[str, str] | None) -> tuple[float, int, str]:
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    return time.perf_counter() - start, r.returncode, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--before", help="the src/ folder of another checkout (e.g. `git worktree add /tmp/base "
                                         "HEAD~1`): its strict cases run interleaved, as before_*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hw-miss-", dir="/tmp") as tmp:
        root = Path(tmp)
        model = write_demo_model(root / "model", "tiny")
        absent, hung = root / "absent", root / "hung"
        for d in (absent, hung):
            d.mkdir(mode=0o700)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(hung / "daemon.sock"))
        listener.listen(64)  # accepts (the kernel's backlog) and never answers
        fd = os.open(hung / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)  # a daemon holds the lock: the client waits for it, as for a real one
        cases = {
            "floor_import_torch": [sys.executable, "-c", "import torch"],
            **{f"strict_{name}": [sys.executable, "-m", "hotweights", "generate", "--model", str(model),
                                  "--model-loader-extra-config",
                                  json.dumps({"fallback": False, "socket_dir": str(d), "connect_timeout_s": 1.0,
                                              "state_timeout_s": 1.0})]
               for name, d in (("no_daemon", absent), ("hung_daemon", hung))},
        }
        runs = {name: (cmd, None) for name, cmd in cases.items()}
        if args.before:
            env = {**os.environ, "PYTHONPATH": args.before}
            runs.update({f"before_{name}": (cmd, env) for name, cmd in cases.items() if name.startswith("strict")})
        times: dict[str, list[float]] = {name: [] for name in runs}
        last: dict[str, str] = {}
        for _ in range(args.repeat):
            for name, (cmd, env) in runs.items():
                seconds, code, line = timed(cmd, env)
                if "strict" in name and code == 0:
                    raise SystemExit(f"{name}: a strict start without a usable daemon succeeded")
                times[name].append(seconds)
                last[name] = line
        listener.close()
    med = {name: round(statistics.median(v), 3) for name, v in times.items()}
    floor = med["floor_import_torch"]
    out = {"command": "python benchmarks/strict_miss.py " + " ".join(sys.argv[1:]), "repeat": args.repeat,
           "median_s": med, "runs_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
           "over_floor_s": {k: round(v - floor, 3) for k, v in med.items() if k != "floor_import_torch"},
           "messages": last}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
