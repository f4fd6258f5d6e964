"""A preload that would not fit is refused before it reads a byte (``loading/headroom.py``).

The cgroup files are read as the kernel writes them (v1 and v2 layouts, a container's view of its
own cgroup as the mount's root); the real drill runs a preload inside a memory cgroup made for it
(root, cgroup v1 or v2 writable: else skipped) with a sparse 4 GiB checkpoint.

Run: pytest tests/test_headroom.py
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import run_cli

from hotweights.loading.headroom import _cgroup_headroom, host_headroom

GIB = 1 << 30


def write(path: Path, **files: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)


def test_a_v1_cgroup_seen_from_inside_its_container_bounds_the_headroom(tmp_path):
    # /proc/self/cgroup names the host's path; the container's mount shows that cgroup as its root
    write(tmp_path / "memory" / "job", memory__limit_in_bytes=str(4 * GIB), memory__usage_in_bytes=str(3 * GIB),
          memory__stat=f"cache 0\ntotal_inactive_file {GIB}\n")
    got = _cgroup_headroom("4:memory:/kubepods/pod1/job\n1:cpu:/\n", tmp_path)
    assert got == (2 * GIB, "cgroup /kubepods/pod1/job: limit 4.00 GiB, 2.00 GiB in use")


def test_a_v2_cgroup_without_a_limit_leaves_memavailable_in_charge(tmp_path):
    write(tmp_path / "user.slice", memory__max="max", memory__current="5", memory__stat="inactive_file 0\n")
    assert _cgroup_headroom("0::/user.slice\n", tmp_path) is None
    write(tmp_path / "user.slice", memory__max=str(GIB))
    assert _cgroup_headroom("0::/user.slice\n", tmp_path)[0] == GIB - 5
    room, source = host_headroom()
    assert room > 0 and ("MemAvailable" in source or "cgroup" in source)


def sparse_checkpoint(directory: Path, nbytes: int, models) -> Path:
    """A checkpoint of one float16 tensor of ``nbytes``, written as a sparse file (no disk used)."""
    directory.mkdir()
    shutil.copy(models["tiny"] / "config.json", directory / "config.json")
    header = json.dumps({"w": {"dtype": "F16", "shape": [nbytes // 2], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + nbytes)
    return directory


def memory_cgroup(limit: int) -> Path | None:
    name = f"hotweights-test-{uuid.uuid4().hex[:8]}"
    for directory, limit_file in ((Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes"),
                                  (Path("/sys/fs/cgroup") / name, "memory.max")):
        try:
            directory.mkdir()
        except OSError:
            continue
        try:
            (directory / limit_file).write_text(str(limit))
            return directory
        except OSError:
            directory.rmdir()
    return None


@pytest.mark.skipif(os.getuid() != 0, reason="making a memory cgroup needs root")
def test_a_preload_larger_than_its_cgroup_allows_is_refused_in_one_line(models, daemon, tmp_path):
    cgroup = memory_cgroup(2 * GIB)
    if cgroup is None:
        pytest.skip("no writable memory cgroup here (v1 or v2)")
    model = sparse_checkpoint(tmp_path / "big", 4 * GIB, models)
    sock = str(daemon.paths.directory)
    try:
        r = subprocess.run(["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", sys.executable, "-m",
                            "hotweights", "preload", "--model", str(model), "--dtype", "float16", "--socket-dir", sock],
                           capture_output=True, text=True, timeout=120)
    finally:
        cgroup.rmdir()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "big as float16 needs 4.00 GiB of host memory; only" in lines[0] and "cgroup" in lines[0]
    assert "limit 2.00 GiB" in lines[0] and "nothing was read or cached" in lines[0]
    status = json.loads(run_cli("status", "--json", "--socket-dir", sock).stdout)
    assert status["running"] and status["entries"] == []  # the daemon lives on, untouched
    # the keeper asks to be the OOM killer's last choice (keeper/process.spare_from_oom_killer): done where
    # it holds CAP_SYS_RESOURCE, else said (a container's root often lacks it, as here on the dev machine)
    if Path(f"/proc/{daemon.pid}/oom_score_adj").read_text().strip() == "-900":
        assert "keeper process: oom_score_adj -900" in daemon.log()
    else:
        assert "oom_score_adj stays 0 (Permission denied: lowering it needs CAP_SYS_RESOURCE" in daemon.log()


def test_a_preload_over_the_daemons_budget_is_refused_before_it_reads(models, socket_dir, tmp_path):
    """``daemon --max-bytes``: the refusal comes before the read (no file digest was computed), in one line."""
    from conftest import DaemonProc

    d = DaemonProc(socket_dir, "--max-bytes", "1M")
    try:
        r = run_cli("preload", "--model", str(models["small"]), "--socket-dir", str(socket_dir),
                    env={"HOTWEIGHTS_CACHE_DIR": str(tmp_path / "digests")})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert "would exceed the daemon budget of 1.00 MiB (0 bytes in use): nothing was read" in lines[0]
        assert not any((tmp_path / "digests").glob("*")), "the checkpoint was read (its digests were cached)"
        assert json.loads(run_cli("status", "--json", "--socket-dir", str(socket_dir)).stdout)["entries"] == []
    finally:
        d.stop()
