"""The states of a model behind the switch, and the moves between them (one table; ``Lifecycle.move`` is the only
door, and refuses, logs and raises on a move the table does not have: a bug, never a user's input). Start-up's two
machines beside it, each with its own table and door (``Startup.preload_moves``, ``Startup.start_moves``): a model's
preload (``PreloadState``) and its start (``StartState``).

    starting -> awake | parked | deep-parked | stopped | failed      (its start-up, or a start for a request)
    awake    -> leaving | parked | deep-parked | stopped | failed
    leaving  -> parked | deep-parked | stopped | failed              (awake, taking no new request: its GPU memory
                                                                       is wanted, and it parks once its requests end)
    parked   -> awake | deep-parked | stopped | failed | starting    (starting: it died parked, and a request
    deep     -> awake | stopped | failed | starting                   starts it again)
    stopped  -> starting | failed
    failed   -> starting | stopped

``failed`` holds two cases apart (``Failure``): an engine that died while it served (the next request starts it
again at once) and a start that failed (retried only after a back-off, or once the checkpoint's files changed:
a start that failed for a reason that will not change is not paid again by every request). A model has a
``Failure`` exactly while it is ``failed``: the move there takes it, every other move clears it. A wake that failed
where the engine stays (parked) is not a failure of the model: its reason is ``Model.last_error``, and the requests
that waited for that switch are answered with it (``Ledger.refuse``).
"""

from __future__ import annotations

import enum
from typing import Literal
from dataclasses import dataclass


class ModelState(enum.StrEnum):
    STARTING = "starting"
    AWAKE = "awake"
    LEAVING = "leaving"
    PARKED = "parked"
    DEEP = "deep-parked"
    STOPPED = "stopped"
    FAILED = "failed"


S = ModelState
TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    S.STARTING: frozenset({S.AWAKE, S.PARKED, S.DEEP, S.STOPPED, S.FAILED}),
    S.AWAKE: frozenset({S.LEAVING, S.PARKED, S.DEEP, S.STOPPED, S.FAILED}),
    S.LEAVING: frozenset({S.PARKED, S.DEEP, S.STOPPED, S.FAILED}),
    S.PARKED: frozenset({S.AWAKE, S.DEEP, S.STOPPED, S.FAILED, S.STARTING}),
    S.DEEP: frozenset({S.AWAKE, S.STOPPED, S.FAILED, S.STARTING}),
    S.STOPPED: frozenset({S.STARTING, S.FAILED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPED}),
}
SERVING = frozenset({S.AWAKE, S.LEAVING, S.PARKED, S.DEEP})  # an engine process that should be alive
RESIDENT = frozenset({S.STARTING, S.AWAKE, S.LEAVING})  # an engine that holds its whole memory


class PreloadState(enum.StrEnum):
    """Where a model's preload is (start-up's, ``startup.py``): each move through ``PRELOAD_MOVES``."""

    QUEUED = "queued"  # not begun: it waits for a job, for GPU memory, or (where preloads do not run ahead of the
    # starts, or it is lazy) for a start that needs it
    RUNNING = "running"  # its process runs (it holds its peak of GPU memory)
    COPYING = "copying"  # its process ended; the host copy of a host-tier model is made (no GPU memory of a preload's)
    RETRY_ALONE = "retry-alone"  # it failed beside other preloads: begun again once none runs, once
    DONE = "done"  # its outcome kept (``Model.preloaded``); its start waits for nothing


P = PreloadState
PRELOAD_MOVES: dict[PreloadState, frozenset[PreloadState]] = {
    P.QUEUED: frozenset({P.RUNNING, P.DONE}),  # done at once: the keeper holds it already, or no process is needed
    P.RUNNING: frozenset({P.COPYING}),
    P.COPYING: frozenset({P.DONE, P.RETRY_ALONE}),
    P.RETRY_ALONE: frozenset({P.RUNNING}),
    P.DONE: frozenset({P.QUEUED}),  # its configuration changed (a reload): preloaded again
}


class StartState(enum.StrEnum):
    """Where a model's start is: each move through ``START_MOVES``. Its engine's state is ``ModelState``; this is
    how far its start has gone, as start-up reads it (which starts may go beside it)."""

    WAITING = "waiting"  # start-up (or a request) has not reached it
    PREPARING = "preparing"  # reached: it waits for its preload, room beside the awake engines, a compile ahead
    STARTING = "starting"  # its engine's process starts
    COMPILED = "compiled"  # its start's log says its code is compiled: a start of the same config loads that code
    PROFILED = "profiled"  # its start's log says the KV cache its profile of the GPU's memory gave
    UP = "up"  # its engine answered ready
    FAILED = "failed"  # its start failed (the model's ``Failure`` says why)


T = StartState
START_MOVES: dict[StartState, frozenset[StartState]] = {
    T.WAITING: frozenset({T.PREPARING}),
    T.PREPARING: frozenset({T.STARTING, T.FAILED}),
    T.STARTING: frozenset({T.COMPILED, T.PROFILED, T.UP, T.FAILED}),
    T.COMPILED: frozenset({T.PROFILED, T.UP, T.FAILED}),
    T.PROFILED: frozenset({T.UP, T.FAILED}),
    T.UP: frozenset({T.STARTING, T.WAITING}),  # its engine died, or could not park: started again; or its
    # configuration changed (a reload): started as a new model
    T.FAILED: frozenset({T.PREPARING, T.STARTING, T.WAITING}),  # start-up tries it again; or a request does; a reload
}
STARTS_GOING_ON = frozenset({T.STARTING, T.COMPILED, T.PROFILED})  # an engine process starting


class InvalidTransition(RuntimeError):
    """A move the table does not allow: the switch's own bug, named with the model and both states."""


class WakeSource(enum.StrEnum):
    """Where a woken engine's weights came from (the ``source`` label of ``hotweights_switch_switches_total``)."""

    KEPT = "kept"  # mapped all along (a level-1 park)
    GPU = "gpu"  # a deep park's, mapped again from the keeper's GPU entry
    HOST = "host"  # a deep park's, uploaded from the keeper's host copy
    DISK = "disk"  # read from the checkpoint (nothing cached)
    START = "start"  # it could not park (or was stopped): started
    RESTART = "restart"  # its engine had died: started again


@dataclass(frozen=True, slots=True)
class PreloadOutcome:
    """What a model's preload did: ``cached`` (it ran; the keeper holds the weights), ``already`` (the keeper held
    them: no preload process ran), ``skipped`` (its engine reads its checkpoint itself), ``failed`` (its engine reads
    its checkpoint; ``note`` says why; for the others, what else it did). ``str()`` is its account in the model's
    ready line."""

    kind: Literal["cached", "already", "skipped", "failed"]
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.kind == "failed"

    def __str__(self) -> str:
        done = f" ({self.note})" if self.note else ""
        return {"cached": f"cached{done}", "already": f"cached already{done}",
                "skipped": f"not preloaded ({self.note})", "failed": f"not cached ({self.note})"}[self.kind]


class FailureKind(enum.StrEnum):
    START = "start"  # its start failed: retried after a back-off, or sooner when its checkpoint's files changed
    DIED = "died"  # it exited while serving: started again at once


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a model is failed: its ``kind``, one line, and for a failed start when it is tried again
    (``retry_at``) and its checkpoint's files then (``files``)."""

    kind: FailureKind
    message: str  # one line
    retry_at: float = 0.0  # time.monotonic() after which a start is tried again
    files: tuple[tuple[str, int, int], ...] = ()  # the checkpoint's (name, size, mtime_ns) when it failed
