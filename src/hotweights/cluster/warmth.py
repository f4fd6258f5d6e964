"""What the cluster knows of a model on a node, and its choices over that, pure (no Ray, no I/O): a node's report
(``NodeReport``, built from its front's own ``/switch/status``, never from the front's internals), the rank of
replicas for one request (``rank``), and which nodes keep a model ready (``placed``).

Warmth, warmest first: awake; parked with its weights on the GPU (a wake of milliseconds); deep-parked, its weights
in host memory (a copy back to the GPU); cached in the node's keeper (an engine start that maps its weights); absent
(a start that reads the checkpoint). Within a warmth, the node with the fewest requests in flight. Three
refinements, each from the first run of ``benchmarks/cluster_trace.py``:

- a model this router sent to a node since that node's last report is awake there (it is being woken or started
  for that request): without it, two requests within one stats period woke a parked model on two nodes, and a
  third parked another model for it;
- a wake on a node with no free awake place (``room`` 0) parks another model there: such a node ranks half a
  warmth colder than one with room;
- a model whose queue on a node has reached ``spread_at`` ranks that node after any node where it is parked and
  before host memory, so a hot model spreads to a node where a wake serves it rather than queueing on one, yet
  never to a start while a queue is all it waits for. An engine batches what it has in flight: the bound is a
  queue, not a batch.

One from its third run: a model awake on several nodes (the default model, awake on each at start; a hot model
that spread) goes to one of them, its home (``AWAY`` ranks the others a quarter warmth colder), until its queue
there reaches the bound. Sent by "fewest in flight" to each, it stayed awake on every node and took a place there
that another model then woke into by turns. The home is the node that wins the model's rendezvous hash among those
where it is awake: every router picks the same one, with no state.

Not covered: how requests reach a node (``router.py``, Ray's), what a node's front does with them (``switch/``).
"""

from __future__ import annotations

import enum
import hashlib
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

K = TypeVar("K", bound=Hashable)
Router = Literal["warmth", "multiplex", "round_robin"]  # ours, and Ray's own two for comparison
ROUTERS: tuple[str, ...] = get_args(Router)  # here, stdlib only: the command line's parser reads it without extras
CROWDED = 0.5  # a wake that parks another model: after a wake into a free place, before host memory
QUEUED = 1.75  # a queue at the bound: after any wake on the GPU (crowded or not), before host memory
AWAY = 0.25  # awake, but not on the model's home: after its home, before any wake


class Warmth(enum.IntEnum):
    """How far a model on a node is from serving (lower: closer); a rank of the router's."""

    AWAKE = 0
    PARKED = 1
    HOST = 2
    CACHED = 3
    ABSENT = 4


def warmth_of(row: Mapping[str, Any]) -> Warmth:
    """A model's warmth from its row of the front's ``/switch/status``: ``leaving`` (it parks once its requests end)
    and ``starting`` (its engine is on the way) rank as parked and host memory; a stopped model whose preload said
    ``cached`` (or ``cached already``: the keeper held it) is cached; a stopped model never preloaded, or a failed
    one, is absent."""
    state = row.get("state")
    if state == "awake":
        return Warmth.AWAKE
    if state in ("parked", "leaving"):
        return Warmth.PARKED
    if state in ("deep-parked", "starting"):
        return Warmth.HOST
    if state == "stopped" and str(row.get("cached") or "").startswith("cached"):  # or "cached already (...)"
        return Warmth.CACHED
    return Warmth.ABSENT


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node as its replica reports it to the router (``record_routing_stats``) at ``at`` (``time.time()``):
    whether its front answers ``/health``, its requests in flight and waiting in all, its free awake places
    (``room``; None where its front's ``max_awake`` is "auto": memory decides), and per model (by name) its warmth
    and its queue there (in flight and waiting)."""

    node: str
    at: float
    healthy: bool
    inflight: int = 0
    models: dict[str, tuple[Warmth, int]] = field(default_factory=dict)
    room: int | None = None

    def to_stats(self) -> dict[str, Any]:
        """What Ray carries to the routers (plain JSON-able values)."""
        return {"node": self.node, "at": self.at, "healthy": self.healthy, "inflight": self.inflight,
                "room": self.room, "models": {name: [int(w), q] for name, (w, q) in self.models.items()}}

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> NodeReport | None:
        """The report in a replica's routing stats; None where it has none yet (a replica starting)."""
        if not stats or "at" not in stats:
            return None
        models = {str(name): (Warmth(int(wq[0])), int(wq[1])) for name, wq in stats.get("models", {}).items()}
        room = stats.get("room")
        return cls(str(stats.get("node", "")), float(stats["at"]), bool(stats.get("healthy")),
                   int(stats.get("inflight", 0)), models, None if room is None else int(room))

    @classmethod
    def from_status(cls, node: str, status: Mapping[str, Any] | None, at: float | None = None) -> NodeReport:
        """A report from the front's ``/switch/status`` (None: the front did not answer: unhealthy, nothing warm)."""
        at = time.time() if at is None else at
        if status is None:
            return cls(node, at, False)
        rows = status.get("models", [])
        models = {r["name"]: (warmth_of(r), int(r.get("inflight") or 0) + int(r.get("waiting") or 0)) for r in rows}
        cap = status.get("max_awake")
        room = max(0, cap - sum(w is Warmth.AWAKE for w, _q in models.values())) if isinstance(cap, int) else None
        return cls(node, at, True, sum(q for _w, q in models.values()), models, room)


def rank(reports: Mapping[K, NodeReport | None], model: str, *, spread_at: int, now: float, stale_after_s: float,
         sent: Mapping[K, int] | None = None) -> list[list[K]]:
    """The replicas for one request of ``model``, best first, in groups of equal rank (Ray picks within a group by
    the fewest requests in flight). A replica's rank is its model's warmth (awake where this router sent the model
    since the replica's report: ``sent``), ``CROWDED`` colder where a wake would park another model (no room),
    ``AWAY`` colder where it is awake but another node is its home (of several awake, the rendezvous hash's winner),
    ``QUEUED`` colder where the model's queue there (reported plus sent) has reached ``spread_at``. A replica whose
    report is missing, older than ``stale_after_s`` or unhealthy ranks after every other, in one last group (the
    request still goes somewhere when nothing better is left)."""
    sent = sent or {}
    live: dict[K, tuple[Warmth, int, NodeReport]] = {}
    for key, report in reports.items():
        if report is not None and report.healthy and now - report.at <= stale_after_s:
            warmth, queue = report.models.get(model, (Warmth.ABSENT, 0))
            live[key] = (Warmth.AWAKE if sent.get(key, 0) else warmth, queue + sent.get(key, 0), report)
    awake = [key for key, (warmth, _q, _r) in live.items() if warmth is Warmth.AWAKE]
    home = max(awake, key=lambda k: _score(model, live[k][2].node or str(k))) if len(awake) > 1 else None
    groups: dict[float, list[K]] = {}
    for key in reports:
        score = math.inf
        if key in live:
            warmth, queue, report = live[key]
            crowded = warmth is not Warmth.AWAKE and report.room == 0
            away = warmth is Warmth.AWAKE and home is not None and key != home
            score = (int(warmth) + (CROWDED if crowded else 0.0) + (AWAY if away else 0.0)
                     + (QUEUED if queue >= spread_at else 0.0))
        groups.setdefault(score, []).append(key)
    return [groups[s] for s in sorted(groups)]


def _score(model: str, node: str) -> bytes:
    """A node's rendezvous score for a model (``placed``, the home in ``rank``)."""
    return hashlib.blake2b(f"{model}\0{node}".encode(), digest_size=8).digest()


def placed(model: str, nodes: Sequence[str], count: int | None) -> set[str]:
    """The nodes that keep ``model`` ready (``count`` of them; None: every one), by rendezvous hashing: each node
    decides alone from the same list, and a node that joins or leaves moves only the models it wins or held."""
    if count is None or count >= len(nodes):
        return set(nodes)
    return set(sorted(nodes, key=lambda n: _score(model, n), reverse=True)[:count])
