"""``hotweights daemon``: the keeper's entry point. Replace the running daemon or open afresh, serve until a
stop or a signal, and exit with the status a service manager reads (``RESTART_EXIT``: start me again)."""

from __future__ import annotations

import logging
import signal

from ..protocol import RESTART_EXIT
from .server import Daemon, DaemonConfig

logger = logging.getLogger("hotweights.daemon")


def run(config: DaemonConfig, *, replace: bool = False, given: frozenset[str] = frozenset()) -> int:
    """Entry point of ``hotweights daemon``: serve until stop, SIGINT or SIGTERM; the exit status
    (``RESTART_EXIT`` when a service manager is to start it again). ``replace``: take every entry and the
    place of the running daemon first (``handover.take_over``), and its settings that are not ``given``."""
    if replace:
        from .handover import inherit, running_status, take_over

        old = running_status(config.paths)
        if old is not None:
            config, line = inherit(config, old, given)
            logger.info("hand-off: %s", line)
    daemon = Daemon(config)
    if replace:
        logger.info("hand-off: %s", take_over(daemon))
    else:
        daemon.open()

    def _on_signal(signum: int, _frame: object) -> None:
        logger.info("signal received: signum=%d; shutting down", signum)
        daemon.stop()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    daemon.serve_forever()
    return RESTART_EXIT if daemon.restart else 0
