#!/usr/bin/env python3
"""Fuzz a real daemon with hostile frames, then prove it is unharmed.

Starts ``hotweights daemon`` in a private directory, publishes a reference entry (random
bytes in sealed memfds), records the daemon's fds, threads and RSS, then sends
``--frames`` frames from ``--workers`` threads, drawn from these cases:

- malformed: random bytes, msgpack of random values, valid ops with wrong field types
- type-confused: str and bytes field names mixed, deep nesting, keys and manifests
  whose fields have the wrong types or absurd values, huge counts
- oversized: a length over the frame cap; frames over the small-frame cap without fds
- truncated: a header or a body cut short, then a close
- stalled: half a header (some with fds) held open past the stall time
- fd-laden: memfds, pipes, /dev/null and eventfds on ops that take none; publishes
  whose fds lie (wrong size, unsealed, a pipe for a cuda pool, too few, too many)
- valid: hello, status, and attaches of the reference entry checked byte for byte

Then: the daemon still answers, its fd count and threads are back at baseline, its RSS
has plateaued (max over the last half of the run minus the value at the half), and
the reference entry attaches bitwise-equal. Prints one JSON line (``--json``) and exits
non-zero when any of that fails.

Run: python tests/fuzz_daemon.py --frames 100000 --json (a tool; tests/test_fuzz.py runs a short form)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import mmap
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack

from hotweights.client import Outcome, connect
from hotweights.errors import HotweightsError
from hotweights.key import CacheKey, ShardId
from hotweights.manifest import Manifest, pack
from hotweights.paths import DaemonPaths
from hotweights.protocol import Attach, Hello, Status, encode
from hotweights.wire import MAX_FRAME_BYTES, recv_frame, send_frame

KEY = CacheKey(shards=(ShardId("fuzz.safetensors", 1 << 20, "h" * 32, "c" * 32),), arch="Fuzz", dtype="float16",
               model="fuzz")
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
CASES = ("malformed", "type_confused", "oversized", "truncated", "stalled", "fd_laden", "valid")


def memfd(nbytes: int, data: bytes = b"", *, sealed: bool = True) -> int:
    fd = os.memfd_create("fuzz", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    if data:
        os.pwrite(fd, data, 0)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


def proc_stats(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(fields["Threads"]),
            "rss": int(fields["VmRSS"].split()[0]) * 1024}


class Fuzzer:
    def __init__(self, paths: DaemonPaths, seed: int) -> None:
        self.paths = paths
        self.seed = seed
        self.counts = {c: 0 for c in CASES}
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.pools, self.specs = pack([("w", "float16", (4096,)), ("v", "float16", (70000,))], pool_bytes=1 << 17,
                                      device="cpu")
        rng = random.Random(seed)
        self.pool_bytes = [rng.randbytes(p.nbytes) for p in self.pools]
        self.digests = [hashlib.sha256(b).hexdigest() for b in self.pool_bytes]

    # -- helpers ----------------------------------------------------------------------

    def sock(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(str(self.paths.socket))
        return s

    def publish_reference(self) -> None:
        fds = [memfd(p.nbytes, b) for p, b in zip(self.pools, self.pool_bytes)]
        try:
            with connect(self.paths) as c:
                c.publish(Manifest(KEY, self.pools, self.specs), fds)
        finally:
            for fd in fds:
                os.close(fd)

    def check_reference(self) -> str:
        """'' if the reference entry attaches byte for byte, else what is wrong."""
        with connect(self.paths, timeout_s=10) as c:
            reply = c.attach(KEY)
            fds = reply.take_fds()
            answer = reply.answer()
        try:
            if answer.outcome is not Outcome.OK:
                return f"reference entry: {answer.outcome} {answer.reason}"
            for fd, pool, want in zip(fds, self.pools, self.digests):
                with mmap.mmap(fd, pool.nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ) as m:
                    if hashlib.sha256(m).hexdigest() != want:
                        return "reference entry: bytes differ"
            return ""
        finally:
            for fd in fds:
                os.close(fd)

    def exchange(self, payload: bytes, fds: list[int] = (), *, header: bytes | None = None) -> None:
        """Send one frame (or raw bytes) and read the answer if one comes; errors are fine."""
        with self.sock() as s:
            try:
                if header is not None:
                    if fds:
                        s.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
                    else:
                        s.sendall(header)
                    if payload:
                        s.sendall(payload)
                    s.shutdown(socket.SHUT_WR)
                else:
                    send_frame(s, payload, fds)
                got, got_fds = recv_frame(s)
                for fd in got_fds:
                    os.close(fd)
            except (OSError, EOFError, Exception):
                pass

    # -- cases ------------------------------------------------------------------------

    def junk(self, rng: random.Random, depth: int = 0):
        kinds = ["int", "str", "bytes", "float", "none", "bool", "list", "map"] if depth < 4 else ["int", "str"]
        kind = rng.choice(kinds)
        if kind == "int":
            return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64 - 1, rng.randint(-1000, 1000)])
        if kind == "str":
            return rng.choice(["", "op", "attach", "publish", "x" * rng.randint(1, 300), "\udcff".encode(
                "utf-8", "surrogatepass").decode("utf-8", "replace")])
        if kind == "bytes":
            return rng.randbytes(rng.randint(0, 40))
        if kind == "float":
            return rng.choice([0.5, float("nan"), float("inf"), -1e308])
        if kind == "none":
            return None
        if kind == "bool":
            return rng.random() < 0.5
        if kind == "list":
            return [self.junk(rng, depth + 1) for _ in range(rng.randint(0, 5))]
        return {self.junk(rng, 4) if rng.random() < 0.3 else rng.choice(["op", "key", "manifest", "version"]):
                self.junk(rng, depth + 1) for _ in range(rng.randint(0, 5))}

    def case_malformed(self, rng: random.Random) -> None:
        pick = rng.random()
        if pick < 0.3:
            self.exchange(rng.randbytes(rng.randint(0, 200)))
        elif pick < 0.7:
            self.exchange(msgpack.packb(self.junk(rng), use_bin_type=True))
        else:
            op = rng.choice(["hello", "status", "attach", "publish", "release", "stop", "hello_ok", "error"])
            body = {"op": op, **{k: self.junk(rng) for k in rng.sample(["version", "key", "manifest", "key_short",
                                                                          "all", "code", "message"], 3)}}
            if op == "stop":
                body["unexpected"] = 1  # never a valid stop
            self.exchange(msgpack.packb(body, use_bin_type=True))

    def case_type_confused(self, rng: random.Random) -> None:
        wire = KEY.to_wire()
        pick = rng.randrange(6)
        if pick == 0:  # str and bytes field names mixed
            body = {"op": "attach", b"key": wire, "version": 1}
        elif pick == 1:
            body = {"op": "attach", "key": {**wire, rng.choice(list(wire)): self.junk(rng)}}
        elif pick == 2:  # deep nesting
            nested: object = 1
            for _ in range(rng.randint(50, 400)):  # msgpack packs up to 512 levels
                nested = [nested]
            body = {"op": "attach", "key": nested}
        elif pick == 3:  # many shards, each plausible
            n = rng.choice([20000, 60000])
            body = {"op": "attach", "key": {**wire, "shards": [[f"s{i}", i, "h", "c"] for i in range(n)]}}
        elif pick == 4:  # a key that differs in every field from the entry, with many shards: a bounded diff
            shards = [[f"model-{i:05d}.safetensors", i + 1, "h" * 32, "c" * 32] for i in range(rng.choice([10, 16000]))]
            body = {"op": "attach", "key": {**wire, "dtype": "bfloat16", "arch": "Other", "shards": shards}}
        else:
            manifest = Manifest(KEY, self.pools, self.specs).to_wire()
            manifest["tensors"] = [[self.junk(rng), "float16", [-1], [1], 0, rng.choice([-8, 0, 2**62]), 8]]
            body = {"op": "publish", "manifest": manifest}
        payload = msgpack.packb(body, use_bin_type=True)
        if len(payload) <= MAX_FRAME_BYTES:
            self.exchange(payload)

    def case_oversized(self, rng: random.Random) -> None:
        if rng.random() < 0.5:
            self.exchange(b"", header=struct.pack(">I", MAX_FRAME_BYTES + rng.randint(1, 1 << 20)))
        else:  # over the small-frame cap without fds: refused before the body is read
            size = rng.randint((1 << 20) + 1, 4 << 20)
            self.exchange(b"\x00" * min(size, 64 << 10), header=struct.pack(">I", size))

    def case_truncated(self, rng: random.Random) -> None:
        payload = encode(Status())
        if rng.random() < 0.5:
            self.exchange(b"", header=struct.pack(">I", len(payload))[: rng.randint(1, 3)])
        else:
            self.exchange(payload[: rng.randint(0, len(payload) - 1)], header=struct.pack(">I", len(payload)))

    def case_stalled(self, rng: random.Random) -> None:
        s = self.sock()
        fd = memfd(4096, sealed=False)
        try:
            header = struct.pack(">I", 100)[: rng.randint(1, 3)]
            n = rng.choice([0, 1, 50, 253])
            if n:
                s.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{n}i", *([fd] * n)))])
            else:
                s.sendall(header)
            time.sleep(rng.choice([0.0, 0.01, 0.05]))
            with self.lock:
                self.stalled.append((time.monotonic() + rng.uniform(0.5, 2.0), s))
            s = None
        except OSError:
            pass
        finally:
            os.close(fd)
            if s is not None:
                s.close()

    def case_fd_laden(self, rng: random.Random) -> None:
        made: list[int] = []
        try:
            pick = rng.randrange(4)
            if pick == 0:  # fds on an op that takes none
                r, w = os.pipe()
                made += [memfd(64), r, w, os.open(os.devnull, os.O_RDONLY), os.eventfd(0)]
                self.exchange(encode(rng.choice([Hello(2), Status(), Attach(KEY)])), made)
                return
            manifest = Manifest(KEY, self.pools, self.specs).to_wire()
            manifest["key"]["dtype"] = rng.choice(["float32", "bfloat16"])  # never replaces the reference
            if pick == 1:  # wrong size or unsealed memfds
                wrong = rng.choice(["size", "seal"])
                made += [memfd(p.nbytes + (256 if wrong == "size" else 0), sealed=wrong == "size") for p in self.pools]
            elif pick == 2:  # cuda pools backed by things that are not GPU memory
                manifest["pools"] = [[n, "cuda:GPU-fuzz"] for n, _ in manifest["pools"]]
                r, w = os.pipe()
                made += rng.sample([r, w, os.open(os.devnull, os.O_RDONLY), os.eventfd(0), memfd(64)], 2)
                for extra in (r, w):
                    if extra not in made:
                        os.close(extra)
            else:  # too few or too many
                made += [memfd(p.nbytes) for p in self.pools]
                made = made[: rng.choice([0, 1])] if rng.random() < 0.5 else made + [memfd(64)]
            self.exchange(msgpack.packb({"op": "publish", "manifest": manifest}, use_bin_type=True), made)
        finally:
            for fd in set(made):
                os.close(fd)

    def case_valid(self, rng: random.Random) -> None:
        pick = rng.randrange(3)
        if pick == 0:
            self.exchange(encode(Hello(2)))
        elif pick == 1:
            self.exchange(encode(Status()))
        else:
            self.exchange(encode(Attach(KEY)))

    # -- run --------------------------------------------------------------------------

    def run(self, frames: int, workers: int, pid: int, samples: list[dict]) -> None:  # noqa: C901
        self.stalled: list[tuple[float, socket.socket]] = []
        next_frame = [0]
        weights = [20, 20, 6, 10, 6, 14, 24]

        def worker(index: int) -> None:
            rng = random.Random(self.seed * 1000 + index)
            while True:
                with self.lock:
                    if next_frame[0] >= frames:
                        return
                    n = next_frame[0]
                    next_frame[0] += 1
                    if n % 2000 == 0:
                        samples.append({"frame": n, **proc_stats(pid)})
                    now = time.monotonic()
                    due = [s for t, s in self.stalled if t <= now]
                    self.stalled = [(t, s) for t, s in self.stalled if t > now]
                for s in due:
                    s.close()
                case = rng.choices(CASES, weights)[0]
                try:
                    getattr(self, f"case_{case}")(rng)
                except (OSError, HotweightsError):  # the daemon may refuse or shed us: part of the test
                    case = "refused"
                except Exception as exc:  # a bug in the fuzzer itself: counted, shown, never silent
                    case = "fuzzer_errors"
                    with self.lock:
                        self.failures.append(f"fuzzer: {exc!r}"[:200])
                with self.lock:
                    self.counts[case] = self.counts.get(case, 0) + 1

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for _, s in self.stalled:
            s.close()


# An engine in another process: attaches the reference entry over and over while the fuzz
# runs, checks it byte for byte, and reports; the hostile traffic must not starve it.
ENGINE = """
import hashlib, json, mmap, os, sys, time
from hotweights.client import Outcome, connect
from hotweights.key import CacheKey
from hotweights.paths import DaemonPaths
from pathlib import Path
paths, key, want = DaemonPaths(Path(sys.argv[1])), CacheKey.from_wire(json.loads(sys.argv[2])), json.loads(sys.argv[3])
ok, failures, slowest = 0, [], 0.0
while not os.path.exists(sys.argv[4]):
    start = time.monotonic()
    try:
        with connect(paths, timeout_s=10) as c:
            reply = c.attach(key)
            fds = reply.take_fds()
            answer = reply.answer()
        got = []
        for fd, size in zip(fds, want["sizes"]):
            with mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ) as m:
                got.append(hashlib.sha256(m).hexdigest())
            os.close(fd)
        if answer.outcome is Outcome.OK and got == want["digests"]:
            ok += 1
        else:
            failures.append(f"{answer.outcome}: {answer.reason}"[:200])
    except Exception as exc:
        failures.append(repr(exc)[:200])
    slowest = max(slowest, time.monotonic() - start)
    time.sleep(0.02)
print(json.dumps({"attaches_ok": ok, "failures": failures[:5], "num_failures": len(failures),
                  "slowest_s": round(slowest, 3)}))
"""


def resting(pid: int, baseline: dict[str, int], timeout_s: float) -> dict[str, int]:
    """Stats once fds and threads are back at baseline (or the last seen after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = proc_stats(pid)
        if (stats["fds"] <= baseline["fds"] and stats["threads"] <= baseline["threads"]) or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def main() -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="hw-fuzz-", dir="/tmp"))
    os.chmod(directory, 0o700)
    paths = DaemonPaths(directory)
    log = open(directory / "fuzz-daemon.log", "wb")
    daemon = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", str(directory)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not paths.socket.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("daemon did not start")
            time.sleep(0.02)
        fuzzer = Fuzzer(paths, args.seed)
        fuzzer.publish_reference()
        time.sleep(0.3)
        baseline = proc_stats(daemon.pid)
        samples: list[dict] = []
        done_flag = directory / "engine.stop"
        engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(directory), json.dumps(KEY.to_wire()),
                                   json.dumps({"sizes": [p.nbytes for p in fuzzer.pools], "digests": fuzzer.digests}),
                                   str(done_flag)], stdout=subprocess.PIPE, text=True)
        start = time.monotonic()
        fuzzer.run(args.frames, args.workers, daemon.pid, samples)
        seconds = time.monotonic() - start
        done_flag.touch()
        engine_report = json.loads(engine.communicate(timeout=60)[0])
        rest = resting(daemon.pid, baseline, 30)
        problem = fuzzer.check_reference() if daemon.poll() is None else "the daemon died"
        rss = [s["rss"] for s in samples] + [rest["rss"]]
        half = rss[len(rss) // 2]
        growth_second_half = max(rss[len(rss) // 2:]) - half
        log.flush()
        log_bytes = (directory / "fuzz-daemon.log").stat().st_size
        longest = max((len(line) for line in open(directory / "fuzz-daemon.log", "rb")), default=0)
        tracebacks = (directory / "fuzz-daemon.log").read_bytes().count(b"Traceback")
        leftover = sorted(os.readlink(f"/proc/{daemon.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{daemon.pid}/fd"))
        result = {
            "frames": args.frames, "workers": args.workers, "seed": args.seed, "seconds": round(seconds, 1),
            "frames_per_s": round(args.frames / seconds), "cases": fuzzer.counts, "alive": daemon.poll() is None,
            "baseline": baseline, "after": rest, "open_fds_after": leftover,
            "rss_mib_samples": [round(r / 2**20, 1) for r in rss],
            "rss_growth_second_half_mib": round(growth_second_half / 2**20, 1), "log_bytes": log_bytes,
            "longest_log_line": longest, "tracebacks": tracebacks,
            "reference_entry": problem or "bitwise equal", "engine": engine_report,
            "fuzzer_failures": fuzzer.failures[:5],
        }
        checks = {
            "daemon alive and answering": result["alive"] and not problem,
            "fds back at baseline": rest["fds"] <= baseline["fds"],
            "threads back at baseline": rest["threads"] <= baseline["threads"],
            "rss plateaued (second half grew < 8 MiB)": growth_second_half < 8 << 20,
            "no traceback in the log": tracebacks == 0,
            "log lines bounded (< 2 KiB)": longest < 2048,
            "an engine in another process attached bitwise-equal throughout": engine_report["num_failures"] == 0
            and engine_report["attaches_ok"] > 0,
            "the fuzzer itself ran clean": not fuzzer.failures,
        }
        result["checks"] = checks
        result["passed"] = all(checks.values())
        if args.json:
            print(json.dumps(result))
        else:
            for name, ok in checks.items():
                print(f"{'PASS' if ok else 'FAIL'}  {name}")
            print(json.dumps({k: v for k, v in result.items() if k != "checks"}, indent=1))
        return 0 if result["passed"] else 1
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
