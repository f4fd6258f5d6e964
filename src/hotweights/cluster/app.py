"""The cluster as a Ray Serve application: ``build`` binds the node deployment (one replica per Ray node, its router
per ``[cluster] router``) under the OpenAI ingress, from a switch config file with a ``[cluster]`` table;
``app_builder`` is Ray Serve's application builder convention (``serve run hotweights.cluster.app:app_builder
config=FILE``, or ``import_path`` and ``args`` in a ``serve deploy`` / KubeRay ``RayService`` config).

The file's text travels with the application (each node need not see the file); each node's front checks its
models' checkpoints where it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from .config import Cluster, ClusterConfigError, parse, read
from .ingress import IngressDeployment
from .node import Node
from .warmth import ROUTERS

ROUTER_CLASSES = {"warmth": "hotweights.cluster.router:WarmthRouter",
                  "round_robin": "ray.serve.experimental.round_robin_router:RoundRobinRouter"}
STALE_PERIODS = 3  # a node whose report is older than this many stats periods ranks last (it is likely gone)


def build(config: str | Path, *, router: str | None = None, nodes: int | None = None) -> Application:
    """The application for the config file ``config``; ``router`` and ``nodes`` override its ``[cluster]`` table's.
    Asks Ray how many nodes it has where ``nodes`` is 0 (so Ray must be up: ``ray.init`` or ``serve run``)."""
    text = read(config)
    cluster = parse(text, Path(config))
    s = cluster.settings
    router = router or s.router
    if router not in ROUTERS:
        raise ClusterConfigError(f"router must be one of {', '.join(ROUTERS)}, got {router!r}")
    if router != s.router:  # the nodes read it from the text: multiplex makes them report what Ray loads
        text = _with_router(text, cluster, router)
    count = nodes or s.nodes or _alive_nodes(s.node_resource)
    options: dict[str, Any] = {"num_replicas": count}
    if s.node_resource:  # a sliver of it: max_replicas_per_node keeps one a node, the resource keeps them on its nodes
        options["ray_actor_options"] = {"num_cpus": 0, "resources": {s.node_resource: 0.01}}
    kwargs = {"spread_at": s.spread_at, "stale_after_s": STALE_PERIODS * s.stats_period_s}
    config_kwargs: dict[str, Any] = {"request_routing_stats_period_s": s.stats_period_s,
                                     "request_routing_stats_timeout_s": max(1.0, 2 * s.stats_period_s)}
    if router in ROUTER_CLASSES:
        config_kwargs["request_router_class"] = ROUTER_CLASSES[router]
        if router == "warmth":
            config_kwargs["request_router_kwargs"] = kwargs
    options["request_router_config"] = RequestRouterConfig(**config_kwargs)
    node = Node.options(**options).bind(text, str(config))
    return IngressDeployment.bind(node, text, str(config))


def app_builder(args: dict[str, str]) -> Application:
    """Ray Serve's builder: ``config=FILE`` (required), ``router=warmth|multiplex|round_robin``, ``nodes=N``."""
    if "config" not in args:
        raise ClusterConfigError("hotweights.cluster.app:app_builder needs config=FILE (a switch config with a "
                                 "[cluster] table)")
    return build(args["config"], router=args.get("router"), nodes=int(args["nodes"]) if args.get("nodes") else None)


def _alive_nodes(resource: str) -> int:
    alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    return len([n for n in alive if not resource or n.get("Resources", {}).get(resource)]) or 1


def _with_router(text: str, cluster: Cluster, router: str) -> str:
    import tomli_w

    raw = {**cluster.raw, "cluster": {**cluster.raw.get("cluster", {}), "router": router}}
    return tomli_w.dumps(raw)
