"""One node of the cluster: a Ray Serve replica (one per Ray node) that starts and owns that node's ``hotweights
switch`` front, relays requests to it, and reports its models' warmth to the routers.

Lifetime: the front is this replica's child, started from a thread that lives as long as it does and told to die
with this process (``HOTWEIGHTS_DIE_WITH``: ``PR_SET_PDEATHSIG``, so a replica killed with its node takes its front,
and the front its engines); a replica that Ray stops stops its front (SIGTERM, and its engines with it) and waits
for it. The keeper stays: the replica Ray brings back on that node finds its models cached, and its start maps them.

Not covered: where requests go (``router.py``); what the front does with them (``switch/``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve

from ..observe import free_port
from ..unix import DIE_WITH_ENV, stop_group
from .config import parse
from .warmth import NodeReport

logger = logging.getLogger("hotweights.cluster")
STATUS_ASK_S = 0.5  # a front slower than this to say its status is reported unhealthy for that period
HEALTH_ASK_S = 5.0


class NodeFront:
    """The replica's body (what ``Node`` deploys), apart from Ray's decorator so that a test may hold one."""

    def __init__(self, config_text: str, config_name: str = "cluster.toml") -> None:
        self.cluster = parse(config_text, Path(config_name))
        s = self.cluster.settings
        self.node = ray.get_runtime_context().get_node_id()
        res = s.node_resource
        nodes = sorted(n["NodeID"] for n in ray.nodes()  # type: ignore[no-untyped-call]
                       if n.get("Alive") and (not res or n.get("Resources", {}).get(res)))
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"hotweights-node-{self.node[:12]}-"))
        sock = str(Path(s.socket_root) / self.node[:12]) if s.socket_root else ""
        if sock:
            Path(sock).mkdir(mode=0o700, parents=True, exist_ok=True)
        toml = self.dir / "switch.toml"
        toml.write_text(self.cluster.node_toml(self.node, nodes, self.port, self.dir / "logs", sock))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.dir / "front.log"
        self.headers = {"authorization": f"Bearer {self.cluster.api_key}"} if self.cluster.api_key else {}
        started = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        # PR_SET_PDEATHSIG fires when the thread that forked the child ends: one that lives as long as the front
        self._keeper = threading.Thread(target=self._own, args=(toml, started), daemon=True, name="hotweights-front")
        self._keeper.start()
        started.wait()
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10), base_url=self.url,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self._wait_healthy(s.start_timeout_s)
        logger.info("cluster: node %s: front ready at %s (config %s, log %s)", self.node[:12], self.url, toml, self.log)
        self._multiplexed = None
        if s.router == "multiplex":  # Ray's default router learns a replica's models from what it "loads"
            async def load_model(model_id: str) -> str:
                return model_id

            self._multiplexed = serve.multiplexed(max_num_models_per_replica=self.cluster.multiplexed_models())(
                load_model)

    def _own(self, toml: Path, started: threading.Event) -> None:
        cmd = [sys.executable, "-m", "hotweights", "switch", "--config", str(toml)]
        env = {**os.environ, DIE_WITH_ENV: str(os.getpid())}
        if self.cluster.settings.socket_root:
            env.pop("HOTWEIGHTS_SOCKET_DIR", None)  # the node's own, from its config
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        started.set()
        self.proc.wait()

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.node[:12]}: its front exited ({self.proc.returncode}): "
                                   f"{_tail(self.log)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=HEALTH_ASK_S).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"node {self.node[:12]}: its front was not healthy in {timeout_s:.0f} s: "
                                   f"{_tail(self.log)}")
            time.sleep(0.2)

    async def answer(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes, str]:
        """One request whose answer is not streamed, in one round trip: its status, headers, body, and this node."""
        await self._loaded()
        r = await self.client.post(path, content=body, headers={**self.headers, "content-type": "application/json"})
        return r.status_code, _kept(r.headers), r.content, self.node

    async def relay(self, path: str, body: bytes) -> AsyncIterator[Any]:
        """One request to the front: first ``{"status", "headers", "node", "first"}`` (``first``: the body's first
        bytes, with the head: one streamed item less before a client's first token), then the rest as it comes."""
        await self._loaded()
        request = self.client.build_request("POST", path, content=body, headers={**self.headers,
                                                                                  "content-type": "application/json"})
        upstream = await self.client.send(request, stream=True)
        try:
            chunks = upstream.aiter_raw()
            first = await anext(chunks, b"")
            yield {"status": upstream.status_code, "headers": _kept(upstream.headers), "node": self.node,
                   "first": first}
            async for chunk in chunks:
                yield chunk
        finally:
            await upstream.aclose()

    async def _loaded(self) -> None:
        if self._multiplexed is not None:  # router = "multiplex": Ray counts this model as loaded here
            await self._multiplexed(serve.get_multiplexed_model_id())

    async def record_routing_stats(self) -> dict[str, Any]:
        """Ray asks every ``stats_period_s``: the front's models and their warmth, from its ``/switch/status``."""
        try:
            r = await self.client.get("/switch/status", headers=self.headers, timeout=STATUS_ASK_S)
            status = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            status = None
        return NodeReport.from_status(self.node, status).to_stats()

    async def check_health(self) -> None:
        """Ray's health check: the front's own ``/health`` (a replica whose front is gone or unhealthy is replaced,
        and its replacement's start is a cached one)."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"node {self.node[:12]}: its front exited: {_tail(self.log)}")
        r = await self.client.get("/health", timeout=HEALTH_ASK_S)
        if r.status_code != 200:
            raise RuntimeError(f"node {self.node[:12]}: its front answers /health {r.status_code}: {r.text[:300]}")

    def stop(self) -> None:
        """The front, and its engines, stopped; returns once they are gone."""
        proc = getattr(self, "proc", None)  # None, or not yet set: a replica whose start failed before its front
        if proc is not None and proc.poll() is None:
            stop_group(proc.pid, 60.0, first=signal.SIGTERM, child=proc)
            logger.info("cluster: node %s: front stopped", self.node[:12])

    def __del__(self) -> None:  # Ray Serve's graceful stop of a replica
        self.stop()


def _kept(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in ("content-type", "cache-control")}


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "no log"


Node = serve.deployment(name="Node", max_replicas_per_node=1, max_ongoing_requests=10_000,
                        ray_actor_options={"num_cpus": 0}, health_check_period_s=5.0,
                        health_check_timeout_s=10.0)(NodeFront)
