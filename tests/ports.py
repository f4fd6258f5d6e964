"""Ports for the servers the tests start, which no other test's server can take meanwhile.

``hotweights.observe.free_port`` asks the kernel for a port free a moment ago (``bind(0)``), and lets it go: two
pytest-xdist workers could get the same one, and then one server's bind fails (``Address already in use``: a
fresh ``make test`` on a 2-core machine, vLLM's server in the standby test). Here each worker takes its own block of
ports below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``: 32768-60999 by default),
one after another and never the same twice in a session. ``bind(0)``, every outgoing connection, and every port
the product picks for itself (an engine behind the switch) come from the ephemeral range, so nothing else takes
these; each is still checked free (another program on the machine may listen there), and skipped if not.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import socket

BASE, BLOCK = 20_000, 600  # gw0: 20000-20599, gw1: 20600-21199, ...; the controller (no xdist): the last block
_worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
_first = BASE + BLOCK * (int(_worker.group(1)) if _worker else 20)
assert _first + BLOCK <= 32_768, "more xdist workers than blocks below the ephemeral range"
# a random start: a session right after another does not meet its ports in TIME_WAIT
_next = itertools.cycle(range(random.randrange(BLOCK), random.randrange(BLOCK) + BLOCK))


def free_port() -> int:
    """A TCP port on 127.0.0.1 of this worker's block that is free now, and that no other worker will pick."""
    for _ in range(BLOCK):
        port = _first + next(_next) % BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {_first}-{_first + BLOCK - 1}")
