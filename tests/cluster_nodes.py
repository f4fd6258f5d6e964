"""A real Ray cluster of several raylets on this machine (``ray.cluster_utils.Cluster``), the hotweights cluster
application on it, each node with its own keeper directory and a front of tiny embedded models: for
tests/test_cluster.py and benchmarks/cluster_trace.py."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

from ports import free_port


def write_config(path: Path, models: dict[str, Path], *, cluster: dict[str, object], switch: dict[str, object],
                 model_keys: dict[str, dict[str, object]] | None = None) -> Path:
    """A switch TOML with a ``[cluster]`` table: ``models`` (name -> checkpoint; the first is the default)."""
    import tomli_w

    tables = [{"name": n, "checkpoint": str(p), "args": ["--max-model-len", "64"], **(model_keys or {}).get(n, {})}
              for n, p in models.items()]
    path.write_text(tomli_w.dumps({"switch": switch, "cluster": cluster, "model": tables}))
    return path


class RayNodes:
    """``nodes`` raylets (the head one of them), Ray Serve's proxy on a free port, and the application deployed from
    ``config``. Each node's keeper lives in ``socket_root``/<node id's first 12>."""

    def __init__(self, nodes: int, config: Path, *, router: str | None = None, cpus_per_node: int = 1) -> None:
        import ray
        from ray import serve
        from ray.cluster_utils import Cluster

        self.ray, self.serve = ray, serve
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node})
        self.workers = [self.cluster.add_node(num_cpus=cpus_per_node) for _ in range(nodes - 1)]
        ray.init(address=self.cluster.address, log_to_driver=False)
        self.cluster.wait_for_nodes()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # one proxy, on the head: every node's would bind this one port of this one host (a real cluster puts a load
        # balancer before the nodes' proxies)
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": self.port})
        self.config = config
        self.deploy(router)

    def deploy(self, router: str | None = None) -> None:
        from hotweights.cluster.app import build

        self.serve.run(build(self.config, router=router), name="hw", route_prefix="/")

    def fronts(self) -> dict[str, str]:
        """Each running node front that answers its ``/health``: its URL by its node id's first 12 (from the config
        each node wrote; a node's directory outlives its front, and another process may have its port since)."""
        found = {}
        for node, (_pid, toml) in front_processes().items():
            url = f"http://127.0.0.1:{tomllib.loads(toml.read_text())['switch']['port']}"
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    found[node] = url
            except (OSError, http.client.HTTPException):
                continue
        return found

    def statuses(self) -> dict[str, dict]:
        out = {}
        for node, url in self.fronts().items():
            with urllib.request.urlopen(url + "/switch/status", timeout=5) as r:
                out[node] = json.loads(r.read())
        return out

    def states(self, model: str) -> dict[str, str]:
        return {n: next(m["state"] for m in s["models"] if m["name"] == model) for n, s in self.statuses().items()}

    def wait_fronts(self, count: int, timeout_s: float = 120, gone: bool = False) -> dict[str, str]:
        """Until ``count`` fronts answer (``gone``: until no more than ``count`` do)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.fronts()
            if (len(found) <= count) if gone else (len(found) >= count):
                return found
            assert time.monotonic() < deadline, f"{len(found)} fronts up, waiting for {count}"
            time.sleep(0.5)

    def ingress_node(self) -> str:
        """The node id of the ingress replica (a node removed with it takes the streams through it)."""
        from ray.util.state import list_actors

        return next(a.node_id for a in list_actors(filters=[("state", "=", "ALIVE")]) if "Ingress" in a.class_name)

    def close(self) -> None:
        socket_root = tomllib.loads(self.config.read_text()).get("cluster", {}).get("socket_root", "")
        try:
            self.serve.shutdown()
        finally:
            self.ray.shutdown()
            self.cluster.shutdown()
            if socket_root:
                for sock in Path(socket_root).glob("*"):
                    subprocess.run([sys.executable, "-m", "hotweights", "stop", "--socket-dir", str(sock)],
                                   capture_output=True, timeout=60, env=os.environ)
                shutil.rmtree(socket_root, ignore_errors=True)


def front_processes() -> dict[str, tuple[int, Path]]:
    """Each running node front's pid and config by its node id's first 12 (the config's path names the node)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        config = next((c.decode() for c in cmd if b"hotweights-node-" in c and c.endswith(b"switch.toml")), "")
        if b"switch" in cmd and config and Path(config).is_file():
            found[Path(config).parent.name.split("-")[2]] = (int(proc.name), Path(config))
    return found
