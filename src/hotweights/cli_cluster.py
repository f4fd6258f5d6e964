"""``hotweights cluster --config FILE [--address ADDR]``: the cluster (``hotweights.cluster``) for those who do not
know Ray: starts a local Ray or joins one, deploys the application, prints its URL, and serves until interrupted
(then deletes the application: each node's front and engines stop; the keepers stay)."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cli_parser import Subparsers

APP = "hotweights"


def cmd_cluster(args: argparse.Namespace) -> int:
    from .cluster.config import ClusterConfigError, load

    try:
        cluster = load(args.config)
    except ClusterConfigError as exc:
        raise ValueError(str(exc)) from None
    import ray
    from ray import serve

    from .cluster.app import build

    s = cluster.settings
    host, port = args.host or s.host, args.port or s.port
    ray.init(address=args.address or "local", namespace="hotweights", log_to_driver=False, include_dashboard=False,
             **({} if args.address else {"num_cpus": args.num_cpus} if args.num_cpus else {}))
    serve.start(http_options={"host": host, "port": port})
    app = build(args.config, router=args.router)
    serve.run(app, name=APP, route_prefix="/", blocking=False)
    url = f"http://{host}:{port}"
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if args.json:
        print(json.dumps({"url": url, "nodes": nodes, "models": [m.name for m in cluster.models],
                          "router": args.router or s.router}), flush=True)
    else:
        print(f"hotweights cluster: serving {', '.join(m.name for m in cluster.models)} on {nodes} node(s) at {url}/v1 "
              f"(router {args.router or s.router}); Ctrl-C stops it", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    serve.delete(APP)  # each replica stops its front, and the front its engines
    if not args.address:
        serve.shutdown()
    print("hotweights cluster: stopped; each node's keeper keeps its weights (hotweights stop ends one)", flush=True)
    return 0


def register(sub: Subparsers) -> None:
    """``hotweights cluster``."""
    p = sub.add_parser("cluster", help="many nodes behind one OpenAI endpoint on Ray Serve: each request goes to a "
                                       "node where its model is warm (pip install 'hotweights[cluster]')")
    p.add_argument("--config", required=True, help="a switch TOML file ([switch], [[model]]) with a [cluster] table")
    p.add_argument("--address", default=None, help="a Ray cluster to join (auto, HOST:PORT or ray://HOST:10001); "
                                                   "default: start a local Ray")
    p.add_argument("--host", default=None, help="the endpoint's address (default: [cluster] host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="the endpoint's port (default: [cluster] port, 8000)")
    from .cluster.warmth import ROUTERS  # stdlib only: every command's parser builds without the [cluster] extra

    p.add_argument("--router", choices=ROUTERS, default=None,
                   help="warmth (ours, the default), or Ray's own routers for comparison")
    p.add_argument("--num-cpus", type=int, default=None, help="a local Ray's CPUs (default: the machine's)")
    p.add_argument("--json", action="store_true", help="the URL line as one JSON object")
    p.set_defaults(run=cmd_cluster)
