"""The request side of the switch: a request waits for its model's engine to be awake (``acquire``), is counted in
flight while it runs (``release`` ends it), and is answered 503 when it cannot be served: its switch failed, its
model is refused, it waited ``request_timeout_s``, or the front stops. Each model's ledger (``model.Ledger``) keeps
the counts; a request only asks the scheduler to look again (``Changes``), and never moves a model. Torch-free.
"""

from __future__ import annotations

import time

from .config import SwitchConfig
from .door import Unavailable
from .metrics import SwitchMetrics
from .model import Changes, Model
from .schedule import refusal
from .states import ModelState

S = ModelState


class Admission:
    def __init__(self, config: SwitchConfig, models: dict[str, Model], changes: Changes,
                 metrics: SwitchMetrics) -> None:
        self.config, self.models, self.changes, self.metrics = config, models, changes, metrics
        self.closing = False  # the front stops: no request waits for a model any more

    async def acquire(self, name: str, due: float | None = None) -> Model:
        """The awake engine of ``name`` with this request counted in flight; Unavailable when it cannot be. ``due``:
        a held stream's next token's due time (``time.monotonic()``), for the deadline schedule."""
        m = self.models[name]
        arrived = m.ledger.arrive(due)
        self.metrics.waiting(name, m.waiting)
        served = False
        try:
            while not m.ledger.enter(awake=m.state is S.AWAKE):  # its place in a switch's batch, or a place of its own
                if self.closing:
                    raise Unavailable("the server is shutting down; retry the request")
                if said := m.ledger.refusal(arrived):  # the switch this request waited for failed
                    raise Unavailable(said)
                if said := refusal(m.view(), time.monotonic()):
                    raise Unavailable(said)
                left = arrived + self.config.request_timeout_s - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"the model `{name}` was not awake within {self.config.request_timeout_s:.0f} "
                                      f"s ({m.state}{': ' + m.error if m.error else ''})")
                await self.changes.next(left)
            served = True
            return m
        finally:
            if m.ledger.gone(arrived, served):  # it gave its batch's place back, and the engine is idle
                self.changes.kick.set()
            self.metrics.waiting(name, m.waiting)

    def release(self, m: Model) -> None:
        if m.ledger.leave():
            self.changes.kick.set()  # an idle engine may make room for a model that waits

    def close(self) -> int:
        """The front stops: every request waiting for its model is answered 503 now (how many waited)."""
        self.closing = True
        self.changes.changed()
        return sum(m.waiting - m.reserved for m in self.models.values())
