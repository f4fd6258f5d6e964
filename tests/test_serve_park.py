"""The embedded server parks and wakes (``serve/park.py``): vLLM's endpoints, the same greedy answer after
every wake, a deep park that really unmaps the keeper's pools, and a wake that cannot be served staying
parked. A real daemon and a real server in subprocesses, strict (no disk fallback).

Run: pytest tests/test_serve_park.py
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import DaemonProc, ServerProc, run_cli

from hotweights import evidence

pytestmark = pytest.mark.slow  # a daemon and a server in subprocesses

PROMPT = {"prompt": "The weight cache", "max_tokens": 8, "temperature": 0}


@pytest.fixture
def parked(models, tmp_path):
    sock = Path(tempfile.mkdtemp(prefix="hwp-", dir="/tmp"))
    daemon = DaemonProc(sock)
    assert run_cli("preload", "--model", str(models["small"]), "--socket-dir", str(sock)).returncode == 0
    server = ServerProc(models["small"], tmp_path / "s.log", "--served-model-name", "tiny", "--max-model-len", "64",
                        "--model-loader-extra-config", json.dumps({"socket_dir": str(sock), "fallback": False}))
    assert server.ready, server.log()
    yield server, sock
    server.stop()
    daemon.stop()


def call(server: ServerProc, method: str, path: str) -> tuple[int, dict | None]:
    req = urllib.request.Request(server.url + path, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def pool_ranges(pid: int) -> list[str]:
    """The address ranges where the server maps the keeper's pools (memfds)."""
    return [line.split()[0] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if "memfd:hotweights-pool" in line]


def pool_mappings(pid: int) -> int:
    return len(pool_ranges(pid))


def status(sock: Path) -> dict:
    done = run_cli("status", "--json", "--socket-dir", str(sock))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def answer(server: ServerProc) -> str:
    status, body = server.post("/v1/completions", PROMPT)
    assert status == 200, body
    return body["choices"][0]["text"]


def test_a_park_refuses_generation_and_a_wake_answers_the_same(parked):
    server, _ = parked
    expected, mapped = answer(server), pool_mappings(server.proc.pid)
    assert mapped > 0 and call(server, "GET", "/is_sleeping") == (200, {"is_sleeping": False})
    assert call(server, "POST", "/sleep?level=1")[0] == 200
    assert call(server, "GET", "/is_sleeping") == (200, {"is_sleeping": True})
    status, body = server.post("/v1/completions", PROMPT)
    assert status == 503 and body["error"]["type"] == "ServiceUnavailableError" and body["error"]["code"] == 503
    assert body["error"]["message"].startswith("the engine is sleeping; POST /wake_up first")
    assert call(server, "GET", "/health")[0] == 503  # it cannot serve: a balancer should look elsewhere
    assert pool_mappings(server.proc.pid) == mapped  # level 1: the weights stay mapped
    assert call(server, "POST", "/wake_up")[0] == 200 and answer(server) == expected
    log = server.log()
    line = next(m for m in evidence.PARKED_RE.finditer(log))
    assert line.group(1) == "tiny" and line.group(2) == "1" and line.group(5) == "weights kept mapped"
    assert [m.group(3) for m in evidence.WOKE_RE.finditer(log)] == ["kept mapped"]


def test_a_deep_park_unmaps_the_pools_and_a_wake_maps_them_again_at_the_same_addresses(parked):
    server, sock = parked
    expected, ranges = answer(server), pool_ranges(server.proc.pid)
    assert call(server, "POST", "/sleep?level=2")[0] == 200
    assert pool_mappings(server.proc.pid) == 0  # nothing of the keeper's pools is mapped while parked
    (row,) = status(sock)["entries"]
    assert row["parked"] == f"{server.proc.pid}:2"  # the keeper lists the engine parked on its entry
    assert call(server, "POST", "/wake_up")[0] == 200
    assert pool_ranges(server.proc.pid) == ranges and answer(server) == expected  # same addresses, same answer
    assert status(sock)["entries"][0]["parked"] == ""
    log = server.log()
    assert any(m.group(2) == "2" and m.group(5) == "weights unmapped" for m in evidence.PARKED_RE.finditer(log))
    assert [m.group(3) for m in evidence.WOKE_RE.finditer(log)] == ["from host"]
    assert log.count("Mapped 47 tensors") == 1  # the start's attach; the wake mapped the pools in place


def test_a_deep_parked_engine_wakes_from_the_host_copy_and_publishes_it_back(parked):
    server, sock = parked
    expected, ranges = answer(server), pool_ranges(server.proc.pid)
    assert call(server, "POST", "/sleep?level=2")[0] == 200
    key = status(sock)["entries"][0]["key"]
    done = run_cli("demote", key[:6], "--json", "--socket-dir", str(sock))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["host_bytes"] > 0
    (row,) = status(sock)["entries"]
    assert row["nbytes"] == 0 and row["host_nbytes"] > 0  # only the host copy is left
    assert call(server, "POST", "/wake_up")[0] == 200
    assert pool_ranges(server.proc.pid) == ranges and answer(server) == expected
    (row,) = status(sock)["entries"]
    assert row["nbytes"] == row["host_nbytes"] > 0  # the wake published the entry back beside its host copy


def test_a_wake_whose_entry_is_gone_stays_parked_and_says_why(parked):
    server, sock = parked
    assert call(server, "POST", "/sleep?level=2")[0] == 200
    assert run_cli("release", "--all", "--socket-dir", str(sock)).returncode == 0
    status, body = call(server, "POST", "/wake_up")
    assert status == 503 and body["error"]["type"] == "ServiceUnavailableError"
    assert "Weight cache unusable (" in body["error"]["message"] and "stays parked" in body["error"]["message"]
    assert call(server, "GET", "/is_sleeping") == (200, {"is_sleeping": True})
    status, body = call(server, "POST", "/sleep?level=3")
    assert status == 400 and "level must be 1 or 2" in body["error"]["message"]


def memfd_inodes(pid: int) -> set[str]:
    """The inodes of the keeper's pools a process maps (one memfd per pool: the same inode, the same bytes)."""
    return {line.split()[4] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if "memfd:hotweights-pool" in line}


def test_two_engines_woken_from_one_host_copy_map_the_same_entry(models, tmp_path):
    """Deep-parked engines on one key, its device tier demoted, woken at once: one of them publishes the entry
    back, the other maps that one; never two copies for one key."""
    import threading

    sock = Path(tempfile.mkdtemp(prefix="hwp-", dir="/tmp"))
    daemon = DaemonProc(sock)
    assert run_cli("preload", "--model", str(models["small"]), "--socket-dir", str(sock)).returncode == 0
    extra = json.dumps({"socket_dir": str(sock), "fallback": False})
    servers = [ServerProc(models["small"], tmp_path / f"{i}.log", "--served-model-name", "tiny", "--max-model-len",
                          "64", "--model-loader-extra-config", extra) for i in range(2)]
    try:
        assert all(s.ready for s in servers)
        expected = [answer(s) for s in servers]
        for s in servers:
            assert call(s, "POST", "/sleep?level=2")[0] == 200
        assert run_cli("demote", status(sock)["entries"][0]["key"], "--socket-dir", str(sock)).returncode == 0
        codes: list[int] = []
        wakers = [threading.Thread(target=lambda s=s: codes.append(call(s, "POST", "/wake_up")[0])) for s in servers]
        for t in wakers:
            t.start()
        for t in wakers:
            t.join()
        assert codes == [200, 200] and [answer(s) for s in servers] == expected
        inodes = [memfd_inodes(s.proc.pid) for s in servers]
        assert inodes[0] and inodes[0] == inodes[1]  # both map the one entry the keeper holds again
        (row,) = status(sock)["entries"]
        # the entry published back by one engine (filled in place: it maps what it published), attached by the other
        assert row["nbytes"] > 0 and row["num_attaches"] == 1
    finally:
        for s in servers:
            s.stop()
        daemon.stop()


def _mapping_at(address: int) -> str:
    for line in Path("/proc/self/maps").read_text().splitlines():
        if int(line.split("-", 1)[0], 16) == address:
            return line
    return ""


def test_a_wake_fills_a_new_pool_at_the_old_address_and_a_failed_fill_leaves_nothing_there():
    """``pools.cpu.fill_at`` with the wake's upload from a host copy's fd (the CPU stand-in): a host copy that
    ends early leaves the address unmapped and no fd open; a whole one makes every old view valid again,
    bitwise, over a sealed memfd."""
    import fcntl
    import os

    import torch

    from hotweights.loading import upload
    from hotweights.manifest import PoolSpec
    from hotweights.pools import cpu

    spec = PoolSpec(1 << 20, "cpu")
    made = cpu.create(spec.nbytes)
    made.as_tensor().fill_(7)
    view = cpu.import_pool(made.export(), spec)
    address = view.data_ptr()
    cpu.unmap(address, spec)
    copy, short = cpu.create(spec.nbytes), cpu.create(spec.nbytes - 4096)
    data = torch.randint(0, 256, (spec.nbytes,), dtype=torch.uint8)
    copy.as_tensor().copy_(data)
    copy_fd, short_fd = copy.export(), short.export()
    fds = len(os.listdir("/proc/self/fd"))

    with pytest.raises(OSError, match="4096 more were expected"):
        cpu.fill_at(address, spec, lambda dst: upload.upload(short_fd, dst))
    assert len(os.listdir("/proc/self/fd")) == fds and "memfd" not in _mapping_at(address)
    fd = cpu.fill_at(address, spec, lambda dst: upload.upload(copy_fd, dst))
    try:
        assert torch.equal(view, data) and view.data_ptr() == address
        assert "memfd:hotweights-pool" in _mapping_at(address)
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE  # nobody writes it after publish
    finally:
        os.close(copy_fd)
        os.close(short_fd)
        os.close(fd)


def prompt_tokens(server: ServerProc) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith("hotweights_server_prompt_tokens_total"))


def test_a_park_that_keeps_its_generation_pauses_it_unmapped_and_the_wake_goes_on_with_nothing_computed_again(
        parked):
    """Issue 69: ``POST /sleep?level=2&mode=keep`` with a stream in flight. The generation stops between two steps,
    its KV cache kept, its stream open and silent while the keeper's pools are unmapped; the wake maps them and the
    stream goes on to the same greedy text as an unparked one, its prompt counted once (no prefill again)."""
    import threading
    import time

    server, _ = parked
    body = {"prompt": "The weight cache", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    status_, plain = server.post("/v1/completions", body)
    assert status_ == 200, plain
    counted = prompt_tokens(server)
    events: list[tuple[float, str]] = []

    def read() -> None:
        req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    events.append((time.monotonic(), json.loads(line[6:])["choices"][0]["text"]))

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 60
    while len(events) < 3:
        assert time.monotonic() < deadline and reader.is_alive()
        time.sleep(0.005)
    assert call(server, "POST", "/sleep?level=2&mode=keep")[0] == 200
    paused_at, during = time.monotonic(), len(events)
    assert pool_mappings(server.proc.pid) == 0 and reader.is_alive()  # the weights unmapped, the stream open
    assert call(server, "GET", "/health")[0] == 503
    time.sleep(1.0)
    assert len(events) <= during + 1 and reader.is_alive()  # silent: nothing generated while parked
    assert call(server, "POST", "/wake_up")[0] == 200
    reader.join(120)
    assert "".join(text for _at, text in events) == plain["choices"][0]["text"]
    assert max(b - a for (a, _), (b, _) in zip(events, events[1:])) >= 0.9  # the pause is in the stream
    assert events[-1][0] > paused_at
    assert prompt_tokens(server) - counted == plain["usage"]["prompt_tokens"]  # counted once: no prefill again
    assert call(server, "POST", "/sleep?level=1&mode=abort")[0] == 400
