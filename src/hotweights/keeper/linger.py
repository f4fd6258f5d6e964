"""Closing a connection with a reason, so that the peer reads the reason, not a reset.

Closing a socket with unread input makes the kernel discard what we sent last: the peer
sees ECONNRESET instead of the error reply. ``drain_and_close`` reads what is pending
first; ``Refuser`` does the same for refused connections on one thread, so that the
accept loop never waits on a peer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from ..protocol import Message, send_message


def drain_and_close(conn: socket.socket) -> None:
    """Close after an error reply without a TCP-style reset: closing with unread input
    makes the kernel discard our reply (ECONNRESET at the peer), so read what is pending first."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(0.5)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and conn.recv(65536):
            pass
    except OSError:
        pass


class Refuser:
    """Answers refused connections and closes them after a short linger, on one thread.

    Closing at once would make the kernel drop our answer when the peer's first request
    is unread (or arrives just after): the peer would see a reset, not the reason. Each
    refused connection lingers ``linger_s`` at most, reading and discarding; at most
    ``max_pending`` linger at once (beyond that, a connection is closed at once).
    """

    def __init__(self, *, linger_s: float = 0.5, max_pending: int = 256) -> None:
        self.linger_s = linger_s
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: dict[socket.socket, float] = {}
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="refuser", daemon=True).start()

    def refuse(self, conn: socket.socket, msg: Message) -> None:
        conn.settimeout(0.1)
        try_send(conn, msg)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
        with self._lock:
            if len(self._pending) >= self.max_pending:
                conn.close()
                return
            conn.setblocking(False)
            self._pending[conn] = time.monotonic() + self.linger_s
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(0.05)
            self._wake.clear()
            with self._lock:
                pending = list(self._pending.items())
            now = time.monotonic()
            for conn, deadline in pending:
                done = now >= deadline
                if not done:
                    try:
                        done = not conn.recv(65536)  # the peer closed: nothing left to protect
                    except BlockingIOError:
                        pass
                    except OSError:
                        done = True
                if done:
                    with self._lock:
                        self._pending.pop(conn, None)
                    conn.close()


def try_send(conn: socket.socket, msg: Message) -> None:
    try:
        send_message(conn, msg)
    except OSError:
        pass
