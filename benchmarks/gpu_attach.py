#!/usr/bin/env python3
"""GPU benchmark and drills, one command: preload, disk load vs attach, equality, survival.

For each demo shape (default ``0.6b`` and ``8b``), on GPU 0, with a private daemon:

1. bandwidth baselines measured in the same run: one-thread page-cache read of the
   checkpoint files, pinned host-to-device copy;
2. cold preload (files evicted with ``posix_fadvise(DONTNEED)``) and warm preload
   (files in page cache), time and GB/s;
3. fresh processes, medians of ``--repeat``: safetensors ``load_file(device="cuda")``
   vs zero-copy attach vs copy attach. Timers start after imports and CUDA context
   creation, which both sides pay alike; attach includes computing the cache key;
4. bitwise equality of every attached tensor with the disk load;
5. drill: SIGKILL the daemon while an attached engine computes: results identical,
   a new daemon starts, memory is freed when the last holder exits (nvidia-smi);
6. drill: after ``release`` a fresh process gets a miss and the memory returns.

Writes ``gpu_attach.json`` and ``gpu_attach.md`` into ``--out``.
Run: PYTHONPATH=src python benchmarks/gpu_attach.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hotweights.verify.memory import evict_page_cache

CHILD = r"""
import json, sys, time, glob
mode, model, sock, dtype = sys.argv[1:5]
import torch
from safetensors.torch import load_file
from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint
from hotweights.pools.devices import resolve_device
import hotweights.pools.cuda
torch.empty(1, device="cuda:0"); torch.cuda.synchronize()

phases = {}

def attach(m):
    t = [time.perf_counter()]
    def clock(phase):  # the time since the previous phase ended, as each ends
        now = time.perf_counter()
        phases[phase] = round((now - t[0]) * 1e3, 3)
        t[0] = now
    key = checkpoint_key(open_checkpoint(model, validate=False), dtype=dtype, device=resolve_device("cuda:0"))
    clock("key")
    return attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False, mode=m), clock=clock)

def disk():
    out = {}
    for f in sorted(glob.glob(model + "/*.safetensors")):
        out.update(load_file(f, device="cuda:0"))
    return out

t0 = time.perf_counter()
if mode == "disk":
    tensors = disk()
elif mode in ("zero_copy", "copy"):
    r = attach(mode)
    assert r.ok, r.reason
    tensors = r.tensors
elif mode == "d2d":  # this GPU's device-to-device copy rate for the same number of bytes
    n = sum(t.numel() * t.element_size() for t in attach("zero_copy").tensors.values())
    src = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        torch.cuda.synchronize(); t = time.perf_counter()
        dst.copy_(src); torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    print(json.dumps({"tbps": n / sorted(times[1:])[2] / 1e12}))
    sys.exit(0)
elif mode == "equal":
    got, ref = attach("zero_copy").tensors, disk()
    bad = [k for k in ref if k not in got or not torch.equal(got[k], ref[k])]
    print(json.dumps({"equal": not bad and sorted(got) == sorted(ref), "num_compared": len(ref), "bad": bad[:5]}))
    sys.exit(0)
elif mode in ("engine", "probe"):
    r = attach("zero_copy")
    if mode == "probe":
        print(json.dumps({"status": r.outcome, "reason": r.reason})); sys.exit(0)
    ws = [t for n, t in sorted(r.tensors.items()) if n.endswith("proj.weight")][:8]
    def compute():
        return [float((torch.ones(4, w.shape[1], dtype=w.dtype, device="cuda:0") @ w.T).float().sum()) for w in ws]
    print(json.dumps({"y": compute()}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"y": compute()}), flush=True)
    sys.stdin.readline()
    sys.exit(0)
torch.cuda.synchronize()
print(json.dumps({"s": time.perf_counter() - t0, "phases_ms": phases}))
"""


def child(mode: str, model: Path, sock: str, dtype: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(model), sock, dtype], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"child {mode} failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpu_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def settle_mib(expect_below: int | None = None, timeout_s: float = 10) -> int:
    deadline = time.monotonic() + timeout_s
    value = gpu_used_mib()
    while expect_below is not None and value >= expect_below and time.monotonic() < deadline:
        time.sleep(0.25)
        value = gpu_used_mib()
    return value


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotweights", *args], capture_output=True, text=True)


def start_daemon(sock: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", sock],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if cli("status", "--socket-dir", sock).returncode == 0:
            return proc
        time.sleep(0.05)
    raise RuntimeError("daemon did not start")


def page_cache_read_gbps(files: list[Path]) -> float:
    buf = bytearray(64 << 20)
    for f in files:  # warm
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    start, total = time.perf_counter(), 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return total / (time.perf_counter() - start) / 1e9


def cold_read_gbps(files: list[Path], threads: int = 4) -> float:
    """Read the evicted files with ``threads`` preadv workers in 64 MiB blocks, as preload does."""
    from concurrent.futures import ThreadPoolExecutor

    block = 64 << 20
    jobs = [(f, off) for f in files for off in range(0, f.stat().st_size, block)]
    evict_page_cache(files[0].parent)

    def work(part: list[tuple[Path, int]]) -> int:
        buf, total, fds = bytearray(block), 0, {}
        for f, off in part:
            fd = fds.get(f) or fds.setdefault(f, os.open(f, os.O_RDONLY))
            total += os.preadv(fd, [buf], off)
        for fd in fds.values():
            os.close(fd)
        return total

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(work, [jobs[i::threads] for i in range(threads)]))
    return total / (time.perf_counter() - start) / 1e9


def pinned_h2d_gbps() -> float:
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    times = []
    for _ in range(6):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return (1 << 30) / statistics.median(times[1:]) / 1e9


def bench_model(size: str, models_dir: Path, repeat: int, log) -> dict:  # noqa: PLR0915
    from hotweights.demo_model import SHAPES, write_demo_model

    dtype = SHAPES[size].dtype
    model = models_dir / size
    if not (model / "config.json").exists():
        t = time.perf_counter()
        write_demo_model(model, size, gen_device="cuda")
        log(f"{size}: generated in {time.perf_counter() - t:.1f} s")
    files = sorted(model.glob("*.safetensors"))
    res: dict = {"size": size, "dtype": dtype, "file_bytes": sum(f.stat().st_size for f in files)}
    res["page_cache_read_gbps"] = round(page_cache_read_gbps(files), 2)
    res["cold_read_gbps"] = round(cold_read_gbps(files), 2)
    sock = tempfile.mkdtemp(prefix="hwg-", dir="/tmp")
    res["gpu_used_mib_baseline"] = settle_mib()
    daemon = start_daemon(sock)
    evict_page_cache(files[0].parent)
    cold = cli("preload", "--model", str(model), "--device", "cuda", "--json", "--socket-dir", sock)
    if cold.returncode != 0:
        raise RuntimeError(cold.stderr)
    cold_line = json.loads(cold.stdout)
    res.update(nbytes=cold_line["nbytes"], cold_preload_s=round(cold_line["seconds"], 3),
               cold_preload_gbps=round(cold_line["gbps"], 2))
    cli("release", "--all", "--socket-dir", sock)
    warm = json.loads(cli("preload", "--model", str(model), "--device", "cuda", "--json", "--socket-dir", sock).stdout)
    res.update(warm_preload_s=round(warm["seconds"], 3), warm_preload_gbps=round(warm["gbps"], 2))
    log(f"{size}: preload cold {res['cold_preload_s']} s, warm {res['warm_preload_s']} s")
    runs: dict[str, list[float]] = {"disk": [], "zero_copy": [], "copy": []}
    phases: dict[str, list[dict]] = {"zero_copy": [], "copy": []}
    for _ in range(repeat):
        for mode in runs:
            out = child(mode, model, sock, dtype)
            runs[mode].append(out["s"])
            if mode in phases:
                phases[mode].append(out["phases_ms"])
    for mode, values in runs.items():
        res[f"{mode}_s_median"] = round(statistics.median(values), 5)
        res[f"{mode}_s_all"] = [round(v, 5) for v in values]
    for mode, rows in phases.items():  # median per phase (the phases of one run add up to its time)
        res[f"{mode}_phases_ms_median"] = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    res["disk_over_zero_copy"] = round(res["disk_s_median"] / res["zero_copy_s_median"], 1)
    res["copy_attach_tbps"] = round(res["nbytes"] / res["copy_s_median"] / 1e12, 3)
    res["d2d_copy_tbps"] = round(child("d2d", model, sock, dtype)["tbps"], 3)
    # the copy's own cost: what copy mode spends after the request beyond what zero_copy spends there
    after = ("map", "views", "wait")
    copy_ms = (sum(res["copy_phases_ms_median"].get(k, 0.0) for k in after)
               - sum(res["zero_copy_phases_ms_median"].get(k, 0.0) for k in after))
    res["copy_over_zero_copy_tbps"] = round(res["nbytes"] / (copy_ms / 1e3) / 1e12, 3) if copy_ms > 0 else None
    log(f"{size}: disk {res['disk_s_median']} s, zero_copy {res['zero_copy_s_median']} s, "
        f"copy {res['copy_s_median']} s")
    res["bitwise"] = child("equal", model, sock, dtype)

    # drill: kill the daemon under a computing engine
    with_entry = settle_mib()
    engine = subprocess.Popen([sys.executable, "-c", CHILD, "engine", str(model), sock, dtype], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    before = json.loads(engine.stdout.readline())["y"]
    daemon.kill()
    daemon.wait()
    engine.stdin.write("\n")
    engine.stdin.flush()
    after = json.loads(engine.stdout.readline())["y"]
    held_by_engine = settle_mib()
    daemon = start_daemon(sock)
    new_daemon_ok = cli("status", "--socket-dir", sock).returncode == 0
    engine.communicate("\n", timeout=60)
    freed = settle_mib(expect_below=res["gpu_used_mib_baseline"] + 1024)
    res["drill_daemon_kill"] = {
        "results_identical": before == after, "new_daemon_started": new_daemon_ok,
        "gpu_used_mib": {"baseline": res["gpu_used_mib_baseline"], "entry_in_daemon": with_entry,
                         "engine_only_after_kill": held_by_engine, "after_engine_exit": freed},
        "memory_freed": freed < res["gpu_used_mib_baseline"] + 1024 <= with_entry,
    }
    # drill: release
    cli("preload", "--model", str(model), "--device", "cuda", "--json", "--socket-dir", sock)
    loaded = settle_mib()
    ok_before = child("probe", model, sock, dtype)["status"]
    released = json.loads(cli("release", "--all", "--json", "--socket-dir", sock).stdout)["released"]
    after_release = child("probe", model, sock, dtype)["status"]
    returned = settle_mib(expect_below=res["gpu_used_mib_baseline"] + 1024)
    res["drill_release"] = {"attach_before": ok_before, "released": released, "attach_after": after_release,
                            "gpu_used_mib": {"loaded": loaded, "after_release": returned},
                            "memory_returned": returned < res["gpu_used_mib_baseline"] + 1024 <= loaded}
    daemon.terminate()
    daemon.wait()
    return res


def environment() -> dict:
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    try:
        from cuda.bindings import __version__ as cb_version
    except ImportError:
        cb_version = "missing"
    return {"gpu": smi, "torch": torch.__version__, "cuda": torch.version.cuda, "cuda_bindings": cb_version,
            "python": platform.python_version(), "cpus": os.cpu_count(), "kernel": platform.release(),
            "command": " ".join(sys.argv)}


def markdown(report: dict) -> str:
    env = report["env"]
    lines = ["# GPU attach benchmark", "", f"- GPU: {env['gpu']}", f"- torch {env['torch']} (CUDA {env['cuda']}), "
             f"cuda-bindings {env['cuda_bindings']}, Python {env['python']}, {env['cpus']} CPUs",
             f"- pinned H2D: {report['pinned_h2d_gbps']} GB/s", f"- command: `{env['command']}`", "",
             "| shape | GB | page-cache read GB/s | cold read GB/s | cold preload s (GB/s) | warm preload s (GB/s) | "
             "disk load s | "
             "zero_copy attach ms | copy attach ms (TB/s) | disk/zero_copy | bitwise equal | survives daemon kill | "
             "memory freed | release works |", "|" + "---|" * 14]
    for r in report["models"]:
        dk, rl = r["drill_daemon_kill"], r["drill_release"]
        lines.append(
            f"| {r['size']} | {r['nbytes'] / 1e9:.2f} | {r['page_cache_read_gbps']} | {r.get('cold_read_gbps')} | "
            f"{r['cold_preload_s']} "
            f"({r['cold_preload_gbps']}) | {r['warm_preload_s']} ({r['warm_preload_gbps']}) | {r['disk_s_median']} | "
            f"{r['zero_copy_s_median'] * 1e3:.2f} | {r['copy_s_median'] * 1e3:.2f} ({r['copy_attach_tbps']}) | "
            f"{r['disk_over_zero_copy']} | {r['bitwise']['equal']} | "
            f"{dk['results_identical'] and dk['new_daemon_started']} | "
            f"{dk['memory_freed']} | {rl['attach_after'] == 'miss' and rl['memory_returned']} |")
    lines += ["", "Medians of fresh processes; raw values in gpu_attach.json.", "",
              "Attach phases (ms, medians; key = computing the cache key from the checkpoint headers):", ""]
    for r in report["models"]:
        for mode in ("zero_copy", "copy"):
            ph = r.get(f"{mode}_phases_ms_median")
            if ph:
                lines.append(f"- {r['size']} {mode}: " + ", ".join(f"{k} {v}" for k, v in ph.items()))
        if "d2d_copy_tbps" in r:
            lines.append(f"- {r['size']}: this GPU's plain device-to-device copy of the same bytes: "
                         f"{r['d2d_copy_tbps']} TB/s; copy attach's extra time over zero_copy (map + views + "
                         f"wait) corresponds to {r['copy_over_zero_copy_tbps']} TB/s")
    lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.6b,8b")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models-dir", type=Path, default=Path("/tmp/hotweights-models"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    report = {"env": environment(), "pinned_h2d_gbps": round(pinned_h2d_gbps(), 2), "models": []}
    for size in args.sizes.split(","):
        report["models"].append(bench_model(size, args.models_dir, args.repeat, log))
        (args.out / "gpu_attach.json").write_text(json.dumps(report, indent=2))
    (args.out / "gpu_attach.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
