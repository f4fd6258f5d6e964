"""What one peer may cost the daemon (``keeper/limits.py``), in-process over real socketpairs.

Run: pytest tests/test_limits.py
"""

from __future__ import annotations

import logging
import socket
import time

import pytest

from hotweights.keeper.limits import Connections, Limits, Phase, Warnings, short


@pytest.fixture
def sockets():
    made: list[socket.socket] = []

    def make() -> socket.socket:
        a, b = socket.socketpair()
        made.extend((a, b))
        return a

    yield make
    for s in made:
        s.close()


def is_shut(conn: socket.socket) -> bool:
    try:
        conn.send(b"x")
    except OSError:
        return True
    return False


@pytest.mark.parametrize("field, value", [("max_connections", 0), ("max_connections_per_pid", 0),
                                          ("idle_timeout_s", 0.0), ("stall_s", -1.0)])
def test_limits_reject_a_bound_that_admits_nothing(field, value):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})


def test_a_pid_at_its_cap_gives_up_its_oldest_silent_connection_but_not_a_fresh_one(sockets):
    table = Connections(max_connections=8, max_per_pid=2, stall_s=0.05)
    first, second, third = sockets(), sockets(), sockets()
    assert table.admit(first, pid=7) == "" and table.admit(second, pid=7) == ""
    assert table.admit(third, pid=7) == "pid 7 already has 2 busy connections (limit 2); retry"  # about to send
    assert not is_shut(first) and not is_shut(second)
    time.sleep(0.1)  # now both have been silent for longer than stall_s
    assert table.admit(third, pid=7) == ""
    assert len(table) == 2 and is_shut(first) and not is_shut(second)


def test_a_connection_being_served_is_never_evicted(sockets):
    table = Connections(max_connections=8, max_per_pid=1, stall_s=1.0)
    served = sockets()
    table.admit(served, pid=7)
    table.enter(served, Phase.SERVING)
    assert table.admit(sockets(), pid=7) == "pid 7 already has 1 busy connections (limit 1); retry"
    assert not is_shut(served)


def test_a_full_table_takes_the_slot_of_a_stalled_frame_not_of_a_fresh_one(sockets):
    table = Connections(max_connections=2, max_per_pid=8, stall_s=0.05)
    stalled, receiving = sockets(), sockets()
    table.admit(stalled, pid=1)
    table.enter(stalled, Phase.RECEIVING)
    time.sleep(0.1)
    table.admit(receiving, pid=2)
    table.enter(receiving, Phase.RECEIVING)
    newcomer = sockets()
    assert table.admit(newcomer, pid=3) == ""
    assert is_shut(stalled) and not is_shut(receiving)
    table.enter(newcomer, Phase.SERVING)
    assert table.admit(sockets(), pid=4) == "all 2 connections are busy; retry"


def test_shedding_closes_only_connections_stalled_inside_a_frame(sockets):
    table = Connections(max_connections=8, max_per_pid=8, stall_s=0.05)
    idle, stalled = sockets(), sockets()
    table.admit(idle, pid=1)
    table.admit(stalled, pid=1)
    table.enter(stalled, Phase.RECEIVING)
    time.sleep(0.1)
    assert table.shed_stalled() == 1 and is_shut(stalled) and not is_shut(idle)


def test_warnings_are_cut_short_and_rate_limited_per_kind(caplog):
    warnings = Warnings(logging.getLogger("test.limits"), burst=2, window_s=0.05)
    with caplog.at_level(logging.WARNING, logger="test.limits"):
        for _ in range(5):
            warnings.warn("bad", "bad request: %s", "x" * 1000)
        warnings.warn("other", "another kind: %s", 1)
        time.sleep(0.1)
        warnings.warn("bad", "bad request: %s", "y")
    lines = caplog.messages
    assert lines[0] == f"bad request: {'x' * 200}...[800 more chars]"
    assert lines[1:] == [lines[0], "another kind: 1", "suppressed 3 similar lines: kind=bad window_s=0",
                         "bad request: y"]
    assert short(12345678901234567890) == 12345678901234567890
