"""The cluster's configuration: the same TOML file a single ``hotweights switch`` reads (its ``[switch]`` table and
``[[model]]`` list, each node's front runs them), with a ``[cluster]`` table of its own, and each node's front
configuration derived from it (``node_toml``). Ray-free.

    [cluster]                # all optional
    host = "127.0.0.1"       # Ray Serve's HTTP proxy (hotweights cluster; serve run/deploy take their own)
    port = 8000
    nodes = 0                # node replicas, one per Ray node; 0: every node of the Ray cluster at deploy time
                             # (with node_resource: every node that has it)
    node_resource = ""       # a Ray custom resource that marks the nodes a replica may run on (KubeRay: the GPU
                             # workers' rayStartParams resources), so none lands on a head without GPUs
    ready_nodes = 2          # a model's ready_nodes where its [[model]] table does not say: how many nodes keep it
                             # ready (its own start: eager or cached), the others start it on a request; "all"
    spread_at = 8            # a model's requests in flight and waiting on a node at which its next request goes to
                             # another node where it is parked or awake (warmth.py)
    stats_period_s = 1.0     # how often each node reports its models' warmth to the routers
    router = "warmth"        # "warmth" (ours), "multiplex" (Ray's default router with multiplexed model ids),
                             # "round_robin" (Ray's); the last two for comparison
    multiplexed_models = 0   # router = "multiplex": models per replica Ray counts as loaded (0: [switch] max_awake,
                             # or 1 where that is "auto")
    socket_root = ""         # each node's keeper in <socket_root>/<node id's first 12>: several nodes on one
                             # host (tests); "": hotweights' own lookup, one keeper per host
    start_timeout_s = 900    # how long a node replica waits for its front's /health before Ray is told it failed

Why ``ready_nodes = 2`` by default: a model kept ready on one node has nowhere warm to go when that node dies or
its queue grows; kept on every node, the cluster holds every model's weights on every node, which is what outgrowing
one box means not to afford. Two: one node's loss or one hot model finds a second node where a start maps the
weights from its keeper (or a wake serves it), at twice one node's memory per model, not N times. The default
model is on every node: each node's front serves it from its start (its ``/health`` waits for it).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from .warmth import Router, placed

ReadyNodes = Annotated[Annotated[int, Field(ge=1)] | Literal["all"], Field(description='"all" or at least 1')]


class ClusterConfigError(ValueError):
    """What is wrong with the cluster's configuration, and where, in one line."""


@dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class ClusterConfig:
    """The ``[cluster]`` table."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    nodes: Annotated[int, Field(ge=0)] = 0
    node_resource: str = ""
    ready_nodes: ReadyNodes = 2
    spread_at: Annotated[int, Field(ge=1)] = 8
    stats_period_s: Annotated[float, Field(gt=0)] = 1.0
    router: Router = "warmth"
    multiplexed_models: Annotated[int, Field(ge=0)] = 0
    socket_root: str = ""
    start_timeout_s: Annotated[float, Field(gt=0)] = 900.0


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """What the ingress and placement need of a ``[[model]]``: its name, its other names, how many nodes keep it
    ready (None: all), whether it is the default."""

    name: str
    aliases: tuple[str, ...]
    ready_nodes: int | None
    default: bool


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The whole file: the ``[cluster]`` table, its models as the cluster sees them, the raw tables (each node's
    front gets them, derived by ``node_toml``), and where it was read from."""

    path: Path
    settings: ClusterConfig
    models: tuple[ModelEntry, ...]
    raw: dict[str, Any]

    @property
    def default(self) -> ModelEntry:
        return next((m for m in self.models if m.default), self.models[0])

    @property
    def routes(self) -> dict[str, str]:
        """Every name a request may ask for -> its model's name."""
        return {n: m.name for m in self.models for n in (m.name, *m.aliases)}

    @property
    def api_key(self) -> str:
        return str(self.raw.get("switch", {}).get("api_key", ""))

    def multiplexed_models(self) -> int:
        """``router = "multiplex"``: how many models Ray counts as loaded on a replica (its awake places)."""
        awake = self.raw.get("switch", {}).get("max_awake", "auto")
        return self.settings.multiplexed_models or (awake if isinstance(awake, int) else 1)

    def node_toml(self, node: str, nodes: list[str], port: int, log_dir: Path, socket_dir: str) -> str:
        """The front configuration of node ``node`` among ``nodes`` (Ray node ids): the file's, on loopback at
        ``port``, its engines' logs in ``log_dir``, its keeper in ``socket_dir`` ("": the file's or hotweights'
        own); a model that this node does not keep ready starts on its first request here (``start = "lazy"``)."""
        switch = {**self.raw.get("switch", {}), "host": "127.0.0.1", "port": port, "log_dir": str(log_dir)}
        if socket_dir:
            switch["socket_dir"] = socket_dir
        tables = []
        for entry, table in zip(self.models, self.raw.get("model", [])):
            ready = entry.name == self.default.name or node in placed(entry.name, nodes, entry.ready_nodes)
            tables.append(table if ready else {**table, "start": "lazy"})
        return tomli_w.dumps({"switch": switch, "model": tables})


def read(path: str | Path) -> str:
    """The file's text (the deployments get the text, not the path: a node need not see the file), or
    ClusterConfigError."""
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise ClusterConfigError(f"cannot read {path}: {exc.strerror}") from None


def load(path: str | Path) -> Cluster:
    """The cluster's view of the TOML file at ``path``; ClusterConfigError naming what is wrong."""
    return parse(read(path), Path(path))


def parse(text: str, path: Path) -> Cluster:
    """The cluster's view of a config file's ``text`` (its ``[cluster]`` table checked; the models' checkpoints are
    checked where they are served, by each node's front); ClusterConfigError naming what is wrong."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterConfigError(f"{path}: not TOML: {exc}") from None
    table = raw.get("cluster", {})
    try:
        settings = ClusterConfig(**table)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(x) for x in error["loc"]) or "?"
        raise ClusterConfigError(f"{path} [cluster]: {key}: {error['msg']} (got {error.get('input')!r})") from None
    except TypeError as exc:  # an unknown key
        raise ClusterConfigError(f"{path} [cluster]: {exc}") from None
    models = raw.get("model", [])
    if not isinstance(models, list) or not models:
        raise ClusterConfigError(f"{path}: no model: the cluster serves the [[model]] tables of a switch config")
    entries = []
    for i, m in enumerate(models):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise ClusterConfigError(f"{path} [[model]] #{i + 1}: name is required")
        ready = m.get("ready_nodes", settings.ready_nodes)
        if ready != "all" and not (isinstance(ready, int) and ready >= 1):
            raise ClusterConfigError(f"{path} [[model]] #{i + 1}: ready_nodes must be \"all\" or at least 1, got "
                                     f"{ready!r}")
        entries.append(ModelEntry(m["name"], tuple(m.get("aliases", ())), None if ready == "all" else ready,
                                  bool(m.get("default", False))))
    return Cluster(path, settings, tuple(entries), raw)
