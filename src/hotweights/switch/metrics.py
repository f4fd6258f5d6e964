"""``hotweights_switch_*``: the front's Prometheus series (its own registry, served on its ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .states import ModelState


class SwitchMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._switches = Counter("hotweights_switch_switches", "Switches to a model, by where its weights came "
                                 "from (kept: mapped all along; gpu/host: a deep park's; start/restart)",
                                 ["model", "source"], registry=r)
        self._seconds = Histogram("hotweights_switch_switch_seconds", "A switch, from taking the lock to the model "
                                  "awake (parking another first included)", ["model"], registry=r,
                                  buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5, 10, 30, 60, 120))
        self._waiting = Gauge("hotweights_switch_waiting_requests", "Requests waiting for their model", ["model"],
                              registry=r)
        self._state = Gauge("hotweights_switch_model_state", "1 for the state each model is in", ["model", "state"],
                            registry=r)
        self.requests = Counter("hotweights_switch_requests", "Requests by model and outcome (ok; engine_4xx, "
                                "engine_5xx: its engine's error; unavailable: a 503 of the front's; abandoned: the "
                                "client left first; refused by the front, model \"\")",
                                ["model", "outcome"], registry=r)
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10, 30, 60)
        self._wait = Histogram("hotweights_switch_wait_seconds", "A request's wait for its model (a switch, a start), "
                               "from its arrival to its engine taking it", ["model"], registry=r, buckets=buckets)
        self._first = Histogram("hotweights_switch_first_byte_seconds", "From a request's arrival to its answer's "
                                "first byte (the time to first token of a stream), its wait included", ["model"],
                                registry=r, buckets=buckets)

    def switch(self, model: str, source: str, seconds: float) -> None:
        self._switches.labels(model, source).inc()
        self._seconds.labels(model).observe(seconds)

    def waiting(self, model: str, n: int) -> None:
        self._waiting.labels(model).set(n)

    def state(self, model: str, state: ModelState) -> None:
        for s in ModelState:
            self._state.labels(model, s.value).set(1 if s is state else 0)

    def waited(self, model: str, seconds: float) -> None:
        self._wait.labels(model).observe(seconds)

    def first_byte(self, model: str, seconds: float) -> None:
        self._first.labels(model).observe(seconds)
