"""The model-aware request router, a Ray Serve ``RequestRouter`` (alpha API, Ray 2.60): each request's model is its
multiplexed model id (set by the ingress), each node replica's warmth for it comes from that replica's routing stats
(``Node.record_routing_stats``, every ``stats_period_s``), and the choice is ``warmth.rank``'s. Within a rank the
replica with the fewest requests in flight goes first: Ray's own count where it has one (fresh: it counts every
request it sends and every answer), else the replica's report plus what this router sent it since.

The ranks go back to Ray one replica each, so that this router knows where a request goes (Ray takes the first
that has room; the node deployment's ``max_ongoing_requests`` is high, as each front queues its own) and counts
it until the replica's next report.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .warmth import NodeReport, rank


class WarmthRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, spread_at: int = 8, stale_after_s: float = 3.0, **_: Any) -> None:
        self.spread_at = spread_at
        self.stale_after_s = stale_after_s
        # per replica: the report time its counts are since, and requests sent since per model
        self._sent: dict[ReplicaID, tuple[float, Counter[str]]] = {}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # no tight loop while every replica is full
        model = pending_request.metadata.multiplexed_model_id if pending_request is not None else ""
        reports = {r.replica_id: NodeReport.from_stats(r.routing_stats) for r in candidate_replicas}
        sent = {rid: self._since(rid, report)[model] for rid, report in reports.items() if report}
        groups = rank(reports, model, spread_at=self.spread_at, now=time.time(), stale_after_s=self.stale_after_s,
                      sent=sent)
        by_id = {r.replica_id: r for r in candidate_replicas}
        order = [by_id[rid] for group in groups for rid in sorted(group, key=lambda x: self._load(x, reports[x]))]
        if order and model:
            first = order[0].replica_id
            if reports[first] is not None:
                self._since(first, reports[first])[model] += 1
        return [[r] for r in order]

    def _since(self, rid: ReplicaID, report: NodeReport | None) -> Counter[str]:
        at = report.at if report is not None else 0.0
        if rid not in self._sent or self._sent[rid][0] != at:
            self._sent[rid] = (at, Counter())
        return self._sent[rid][1]

    def _load(self, rid: ReplicaID, report: NodeReport | None) -> int:
        known = self.replica_queue_len_cache.get(rid)
        if known is not None:
            return int(known)
        since = sum(self._sent[rid][1].values()) if rid in self._sent else 0
        return (report.inflight if report is not None else 0) + since
