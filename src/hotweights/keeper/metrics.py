"""The daemon's Prometheus metrics (``hotweights daemon --metrics-port N``), with ``prometheus-client``.

Opt-in: without ``--metrics-port`` nothing is imported or served, and the attach path calls a no-op
(``NO_METRICS``). With it, a plain HTTP ``GET /metrics`` in the text exposition format is served on
127.0.0.1 (``--metrics-host`` to widen it); the daemon's own socket stays private. Counters and the
attach histogram are updated as requests are served; everything else (entries, bytes, clients, fds,
budget) is read from the daemon at scrape time. Names are ``hotweights_*`` with units in the name;
model names and digests appear only on ``hotweights_entry_info`` (one series per entry), never as
labels of the other series.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

from .. import __version__


class NoMetrics:
    """What the ops call when metrics are off: nothing."""

    def attach(self, result: str, seconds: float) -> None:
        pass

    def publish(self, result: str) -> None:
        pass


NO_METRICS = NoMetrics()


class Metrics(NoMetrics):
    def __init__(self, snapshot: Callable[[], dict[str, Any]], *, backend: str = "memfd+cuda-vmm") -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: a process of its own, restarted rarely
        self.registry = CollectorRegistry(auto_describe=True)
        self._attach = Counter("hotweights_attach", "Attach requests served, by result",
                               ["result"], registry=self.registry)
        self._attach_s = Histogram("hotweights_attach_duration_seconds",
                                   "Time the daemon took to answer an attach (lookup, fd dups)",
                                   buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0),
                                   registry=self.registry)
        self._publish = Counter("hotweights_publish", "Publish requests, by result", ["result"],
                                registry=self.registry)
        for result in ("ok", "miss", "mismatch", "error"):
            self._attach.labels(result)
        for result in ("ok", "refused"):
            self._publish.labels(result)
        self.last_served = 0.0
        self.registry.register(_Snapshot(snapshot, self, backend))

    def attach(self, result: str, seconds: float) -> None:
        self._attach.labels(result).inc()
        self._attach_s.observe(seconds)
        self.last_served = time.time()

    def publish(self, result: str) -> None:
        self._publish.labels(result).inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> WSGIServer:
        """Serve /metrics on a thread; the HTTP server (``shutdown()`` ends it)."""
        from prometheus_client import start_http_server

        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve /metrics on {host}:{port} ({exc.strerror}): another process has "
                                     f"the port; pass another --metrics-port") from None
        return server


class _Snapshot:
    """The gauges, read from the daemon when Prometheus scrapes."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], metrics: Metrics, backend: str) -> None:
        self.snapshot, self.metrics, self.backend = snapshot, metrics, backend

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        s = self.snapshot()
        yield InfoMetricFamily("hotweights", "The daemon", value={"version": __version__, "backend": self.backend})
        info = InfoMetricFamily("hotweights_entry", "One series per cached entry", labels=["key", "model", "dtype",
                                                                                            "layout", "device"])
        for e in s["entries"]:
            info.add_metric([e.key, e.model, e.dtype, e.layout, e.device], {})
        yield info
        yield GaugeMetricFamily("hotweights_entries", "Entries held", value=len(s["entries"]))
        resident = GaugeMetricFamily("hotweights_resident_bytes", "Bytes of pools held, by device and tier",
                                     labels=["device", "tier"])
        for device, nbytes in sorted(s["bytes_by_device"].items()):
            resident.add_metric([device, "host" if device == "cpu" else "gpu"], nbytes)
        yield resident
        host = GaugeMetricFamily("hotweights_entry_host_copy_bytes", "Bytes of an entry's host copy (0: none)",
                                 labels=["key"])
        parked = GaugeMetricFamily("hotweights_entry_parked_engines", "Engines parked on an entry", labels=["key"])
        for e in s["entries"]:
            host.add_metric([e.key], e.host_nbytes)
            parked.add_metric([e.key], len(e.parked_on))
        yield host
        yield parked
        yield GaugeMetricFamily("hotweights_clients", "Live client connections", value=s["clients"])
        yield GaugeMetricFamily("hotweights_open_fds", "File descriptors open in the daemon",
                                value=len(os.listdir("/proc/self/fd")))
        yield GaugeMetricFamily("hotweights_max_fds", "The daemon's fd limit (RLIMIT_NOFILE)",
                                value=os.sysconf("SC_OPEN_MAX"))
        yield GaugeMetricFamily("hotweights_budget_bytes", "--max-bytes (0: no budget)", value=s["max_bytes"])
        yield GaugeMetricFamily("hotweights_last_served_timestamp_seconds",
                                "Unix time of the last attach answered (0: none yet)", value=self.metrics.last_served)
