"""What one peer may cost the daemon: connection slots, and the lines it can make it log.

``Connections`` admits a connection, evicting another when the table is full: first a
silent one of the same pid when that pid is at its cap, else the least recently active
silent connection anywhere. Silent: idle (waiting for its next or first frame) or stalled
inside a frame, either for longer than ``stall_s``. A connection that is being served, or
that was admitted or answered less than ``stall_s`` ago, is never evicted: its client is
about to send a frame, and shedding it would turn a busy moment into a failed request.
The newcomer is refused instead ("busy; retry"), and clients retry within their deadline.
So a client that opens and forgets connections, or starts frames and stalls, cannot lock
out the engines, and 64 threads of one engine attaching at once all succeed.

``Warnings`` bounds each warning line (every field cut to ``FIELD_CHARS`` characters)
and rate-limits them per kind: at most ``burst`` lines per ``window_s``, then one line
saying how many were suppressed.

``Limits`` holds every bound the daemon applies per connection and per request.

Stdlib only.
"""

from __future__ import annotations

import enum
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

FIELD_CHARS = 200


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 128
    max_connections_per_pid: int = 16
    idle_timeout_s: float = 60.0  # between frames
    frame_timeout_s: float = 10.0  # from a frame's first byte to its last
    stall_s: float = 1.0  # a connection this long inside an unfinished frame may be evicted
    small_frame_bytes: int = 1 << 20  # larger frames must carry fds (only a publish does)
    large_frame_wait_s: float = 30.0  # how long a large frame waits for the one being read

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_pid", "small_frame_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "frame_timeout_s", "stall_s", "large_frame_wait_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class Phase(enum.Enum):
    IDLE = "idle"  # waiting for the next frame
    RECEIVING = "receiving"  # inside a frame
    SERVING = "serving"  # handling a request or sending the reply


@dataclass(slots=True)
class _Slot:
    pid: int
    phase: Phase = Phase.IDLE
    since: float = field(default_factory=time.monotonic)


class Connections:
    def __init__(self, *, max_connections: int, max_per_pid: int, stall_s: float) -> None:
        self.max_connections = max_connections
        self.max_per_pid = max_per_pid
        self.stall_s = stall_s
        self._lock = threading.Lock()
        self._slots: dict[socket.socket, _Slot] = {}

    def admit(self, conn: socket.socket, pid: int) -> str:
        """Take a slot for ``conn`` (evicting as above); '' on success, else why not."""
        with self._lock:
            mine = [c for c, s in self._slots.items() if s.pid == pid]
            if len(mine) >= self.max_per_pid and not self._evict(mine):
                return f"pid {pid} already has {len(mine)} busy connections (limit {self.max_per_pid}); retry"
            if len(self._slots) >= self.max_connections and not self._evict(list(self._slots)):
                return f"all {self.max_connections} connections are busy; retry"
            self._slots[conn] = _Slot(pid)
            return ""

    def _evict(self, candidates: list[socket.socket]) -> bool:
        now = time.monotonic()
        evictable = [c for c in candidates if self._slots[c].phase is not Phase.SERVING
                     and now - self._slots[c].since > self.stall_s]
        if not evictable:
            return False
        oldest = min(evictable, key=lambda c: self._slots[c].since)
        del self._slots[oldest]
        _shut(oldest)  # its thread sees end-of-file (or an error) and exits
        return True

    def enter(self, conn: socket.socket, phase: Phase) -> None:
        with self._lock:
            slot = self._slots.get(conn)
            if slot is not None:
                slot.phase, slot.since = phase, time.monotonic()

    def leave(self, conn: socket.socket) -> None:
        with self._lock:
            self._slots.pop(conn, None)

    def shed_stalled(self) -> int:
        """Close every connection stalled inside a frame (they may hold fds in flight)."""
        with self._lock:
            now = time.monotonic()
            stalled = [c for c, s in self._slots.items() if s.phase is Phase.RECEIVING and now - s.since > self.stall_s]
            for c in stalled:
                del self._slots[c]
                _shut(c)
            return len(stalled)

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)


def _shut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Warnings:
    def __init__(self, logger: logging.Logger, *, burst: int = 20, window_s: float = 10.0) -> None:
        self.logger = logger
        self.burst = burst
        self.window_s = window_s
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int, int]] = {}  # kind -> (start, logged, suppressed)

    def warn(self, kind: str, fmt: str, *args: object) -> None:
        """``logger.warning(fmt, *args)`` with every argument cut short, rate-limited per ``kind``."""
        now = time.monotonic()
        with self._lock:
            start, logged, suppressed = self._windows.get(kind, (now, 0, 0))
            if now - start > self.window_s:
                if suppressed:
                    self.logger.warning("suppressed %d similar lines: kind=%s window_s=%.0f", suppressed, kind,
                                        self.window_s)
                start, logged, suppressed = now, 0, 0
            if logged >= self.burst:
                self._windows[kind] = (start, logged, suppressed + 1)
                return
            self._windows[kind] = (start, logged + 1, suppressed)
        self.logger.warning(fmt, *(short(a) for a in args))


def short(value: object, limit: int = FIELD_CHARS) -> object:
    """``value`` unchanged if it is a number or short; else its text cut to ``limit`` characters."""
    if isinstance(value, (int, float)):
        return value
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}...[{len(text) - limit} more chars]"
