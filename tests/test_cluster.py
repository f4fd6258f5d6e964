"""The cluster on real Ray (``hotweights.cluster``): three raylets on this machine (``ray.cluster_utils.Cluster``),
each node with its own keeper and a front of tiny embedded models, Ray Serve's HTTP proxy in front, the official
``openai`` client. Each node keeps one awake place (``max_awake = 1``), and each model but the default is kept ready
on two of the three nodes (``ready_nodes = 2``), so that a model is awake on one node, parked on another and absent
on the third.

Properties: answers streamed and not, through Ray Serve, by every name; each request goes to the node where its
model is warmest; a hot model spreads to its second node, never to the node where it is absent; a node removed mid-
trace loses only its streams in flight (each ended with an error event and ``[DONE]``), the router stops sending to
it, and a replica Ray brings back on a node finds its models cached in that node's keeper; the application deleted
leaves no front and no engine running (the keepers stay, by design).

Run: pytest tests/test_cluster.py   (slow: about 2-3 minutes)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
import tomllib
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve")

from cluster_nodes import RayNodes, front_processes, write_config
from hotweights.unix import pid_alive

pytestmark = pytest.mark.slow
NODE = "x-hotweights-node"


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory) -> dict[str, Path]:
    from hotweights.demo_model import write_demo_model

    root = tmp_path_factory.mktemp("cluster-models")
    return {f"m{i}": write_demo_model(root / f"m{i}", "tiny", seed=i) for i in range(4)}


def test_hotweights_cluster_starts_a_local_ray_prints_its_url_serves_and_stops_on_ctrl_c(demo_models, tmp_path):
    """The command for those who do not know Ray (first in this module: its own local Ray, before the cluster of
    raylets below starts)."""
    import subprocess
    import sys

    from ports import free_port

    port = free_port()
    socket_root = tempfile.mkdtemp(prefix="hwl", dir="/tmp")
    config = write_config(tmp_path / "one.toml", {"m0": demo_models["m0"], "m1": demo_models["m1"]},
                          cluster={"socket_root": socket_root, "port": port}, switch={"max_awake": 1})
    proc = subprocess.Popen([sys.executable, "-m", "hotweights", "cluster", "--config", str(config), "--num-cpus", "1",
                             "--json"], stdout=subprocess.PIPE, stderr=open(tmp_path / "cluster.log", "wb"), text=True)
    try:
        said = json.loads(proc.stdout.readline() or "{}")
        assert said.get("url") == f"http://127.0.0.1:{port}", (tmp_path / "cluster.log").read_text()[-3000:]
        assert said["nodes"] == 1 and said["models"] == ["m0", "m1"] and said["router"] == "warmth"
        assert complete(said["url"], "m1").status_code == 200
        fronts = list(front_pids().values())
        assert fronts
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
        assert "stopped" in proc.stdout.read()
        assert not any(pid_alive(p) for p in fronts)
    finally:
        if proc.poll() is None:
            proc.kill()
        for sock in Path(socket_root).glob("*"):
            subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", str(sock)], capture_output=True)


@pytest.fixture(scope="module")
def ray_nodes(demo_models, tmp_path_factory):
    socket_root = tempfile.mkdtemp(prefix="hwc", dir="/tmp")  # short: AF_UNIX paths are capped
    config = write_config(tmp_path_factory.mktemp("cluster") / "cluster.toml", demo_models,
                          cluster={"socket_root": socket_root, "ready_nodes": 2, "spread_at": 2,
                                   "stats_period_s": 0.5},
                          switch={"max_awake": 1, "request_timeout_s": 60},
                          model_keys={"m1": {"aliases": ["one"]}})
    nodes = RayNodes(3, config)
    nodes.wait_fronts(3)
    yield nodes
    nodes.close()


def complete(url: str, model: str, max_tokens: int = 4, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hello", "max_tokens": max_tokens,
                                                     "temperature": 0, **extra}, timeout=120)


def placed_nodes(ray_nodes: RayNodes, model: str) -> set[str]:
    """The nodes whose front keeps ``model`` ready (its start there not lazy)."""
    return {n for n, s in ray_nodes.statuses().items()
            if next(m for m in s["models"] if m["name"] == model)["start"] != "lazy"}


def test_the_openai_client_is_answered_through_ray_serve_streamed_and_not_by_name_and_alias(ray_nodes):
    import openai

    client = openai.OpenAI(base_url=ray_nodes.url + "/v1", api_key="none", max_retries=0, timeout=120)
    names = sorted(m.id for m in client.models.list().data)
    assert names == ["m0", "m1", "m2", "m3", "one"]
    got = client.completions.create(model="one", prompt="The weight cache", max_tokens=4, temperature=0)
    assert got.model == "m1" and got.choices[0].text is not None
    streamed = client.completions.create(model="m2", prompt="The weight cache", max_tokens=6, temperature=0,
                                         stream=True)
    chunks = [c for c in streamed]
    assert len(chunks) >= 2 and all(c.model == "m2" for c in chunks)
    said = complete(ray_nodes.url, "nope")
    assert said.status_code == 404 and "nope" in said.json()["error"]["message"]


def test_each_request_goes_to_the_node_where_its_model_is_warmest(ray_nodes):
    for model in ("m1", "m2", "m3", "m1", "m3"):
        time.sleep(1.2)  # two stats periods: the router sees what the last request left
        states = ray_nodes.states(model)
        rank = {"awake": 0, "parked": 1, "leaving": 1, "deep-parked": 2, "starting": 2}
        best = min(rank.get(s, 3) for s in states.values())
        served = complete(ray_nodes.url, model)
        assert served.status_code == 200, served.text
        node = served.headers[NODE][:12]
        assert rank.get(states[node], 3) == best, (model, node, states)
        assert node in placed_nodes(ray_nodes, model), "never where it is absent while it is warm elsewhere"


def test_a_hot_model_spreads_to_its_second_node_and_never_to_the_one_where_it_is_absent(ray_nodes):
    placed = placed_nodes(ray_nodes, "m3")
    deadline = time.monotonic() + 120
    while any(ray_nodes.states("m3")[n] not in ("awake", "parked") for n in placed):
        # its start on each of them done: a queue never spreads to a start (warmth.rank), and this test alone (the
        # fronts just up) found m3 still starting on its second node, every request on its first
        assert time.monotonic() < deadline, ray_nodes.states("m3")
        time.sleep(0.2)
    assert complete(ray_nodes.url, "m3").status_code == 200  # awake on one of its two nodes
    time.sleep(1.2)

    async def burst() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as c:
            async def one(i: int) -> str:
                await asyncio.sleep(0.05 * i)
                r = await c.post(f"{ray_nodes.url}/v1/completions", json={
                    "model": "m3", "prompt": "hello", "max_tokens": 48, "temperature": 0})
                assert r.status_code == 200, r.text
                return r.headers[NODE][:12]
            return list(await asyncio.gather(*(one(i) for i in range(8))))

    served = asyncio.run(burst())
    assert set(served) == placed, (served, placed, ray_nodes.states("m3"))


def test_a_replica_killed_takes_its_front_and_comes_back_on_its_node_with_its_models_cached(ray_nodes):
    fronts = front_pids()
    node, front = sorted(fronts.items())[0]
    replica = parent_of(front)
    os.kill(replica, signal.SIGKILL)  # the replica's worker process, as the OOM killer would
    deadline = time.monotonic() + 60
    while pid_alive(front):
        assert time.monotonic() < deadline, "its front outlived its replica"
        time.sleep(0.2)
    deadline = time.monotonic() + 180
    while True:
        status = ray_nodes.statuses().get(node)
        if status and all(m["state"] != "starting" for m in status["models"]):
            break
        assert time.monotonic() < deadline, "no front came back on the node"
        time.sleep(0.5)
    assert front_pids()[node] != front
    kept = [m for m in status["models"] if m["start"] != "lazy"]
    assert kept and all(m["cached"].startswith("cached already") for m in kept), [m["cached"] for m in kept]


def test_a_node_removed_mid_trace_loses_only_its_streams_and_is_routed_around(ray_nodes):
    ingress = ray_nodes.ingress_node()
    victim = next(w for w in reversed(ray_nodes.workers) if w.node_id != ingress)
    gone = victim.node_id[:12]
    results: list[tuple[float, str, str]] = []  # (sent at, outcome, node)

    async def trace() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            async def one(i: int) -> None:
                await asyncio.sleep(0.15 * i)
                sent = time.monotonic()
                model = f"m{i % 4}"
                try:
                    async with c.stream("POST", f"{ray_nodes.url}/v1/completions", json={
                            "model": model, "prompt": "hello", "max_tokens": 32, "temperature": 0,
                            "stream": True}) as r:
                        if r.status_code != 200:
                            results.append((sent, f"http_{r.status_code} {(await r.aread())[:300]!r}", ""))
                            return
                        data = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
                except httpx.HTTPError as exc:
                    results.append((sent, f"transport {exc}", ""))
                    return
                errored = any('"error"' in d for d in data)
                assert data[-1] == "[DONE]", data[-3:]
                results.append((sent, "cut" if errored else "ok", r.headers[NODE][:12]))

            async def remove() -> None:
                await asyncio.sleep(2.0)
                deadline = time.monotonic() + 20
                while not any(n == gone for *_r, n in results) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)  # the node served some of the trace before it goes (a loaded machine)
                await asyncio.to_thread(ray_nodes.cluster.remove_node, victim)
                results.append((time.monotonic(), "removed", gone))

            await asyncio.gather(remove(), *(one(i) for i in range(90)))

    try:
        asyncio.run(trace())
    finally:  # a node in its place, whatever this test found: the next test's cluster has three
        if any(what == "removed" for _t, what, _n in results):
            ray_nodes.workers.remove(victim)
            ray_nodes.workers.append(ray_nodes.cluster.add_node(num_cpus=1))
            ray_nodes.wait_fronts(3, timeout_s=180)  # Ray places the third replica on the new node
    removed = next(t for t, what, _n in results if what == "removed")
    rows = [r for r in results if r[1] != "removed"]
    failed = [r for r in rows if r[1] not in ("ok", "cut")]
    assert not failed, failed
    assert all(n == gone for _t, what, n in rows if what == "cut"), "only the gone node's streams are cut"
    assert any(n == gone and t < removed for t, _what, n in rows), "the gone node served before it went"
    late = [r for r in rows if r[0] > removed + 1.0 and r[2] == gone]  # one stats period (0.5 s), and a margin
    assert not late, late


def test_deleting_the_application_stops_every_front_and_engine_and_keeps_the_keepers(ray_nodes):
    pids = [m["pid"] for s in ray_nodes.statuses().values() for m in s["models"] if m.get("pid")]
    fronts = list(front_pids().values())
    assert pids and len(fronts) == 3
    ray_nodes.serve.delete("hw")
    deadline = time.monotonic() + 90
    while any(pid_alive(p) for p in pids + fronts):
        assert time.monotonic() < deadline, [p for p in pids + fronts if pid_alive(p)]
        time.sleep(0.5)
    socket_root = tomllib.loads(ray_nodes.config.read_text())["cluster"]["socket_root"]
    keepers = list(Path(socket_root).glob("*/daemon.sock"))
    assert len(keepers) >= 3, keepers  # each node's: the next start there maps its weights
    ray_nodes.deploy()  # for the fixture's close


def front_pids() -> dict[str, int]:
    return {node: pid for node, (pid, _config) in front_processes().items()}


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
