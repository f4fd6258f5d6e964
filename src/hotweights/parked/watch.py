"""The watcher of one server a ``--park-on-exit`` launcher started (``python -m hotweights.parked.watch RECORD``,
torch-free): stops it when its launcher is gone without parking it, retires it parked after its idle time
or once the keeper holds none of its entries (``parked.py``)."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from ..unix import proc_stat
from .records import alive, read_record, retire


def parked_keys(daemon_dir: Path, session: int) -> list[str]:
    """Short keys of the entries the keeper lists a process of ``session`` as parked on."""
    from ..client import connect
    from ..errors import HotweightsError
    from ..paths import daemon_paths

    try:
        with connect(daemon_paths(daemon_dir)) as client:
            rows = client.status().rows()
    except (HotweightsError, OSError):
        return []
    return [r.key for r in rows if any(_session_of(pid) == session for pid, _ in r.parked_on)]


def _session_of(pid: int) -> int:
    fields = proc_stat(pid)
    return int(fields[3]) if fields else -1  # state ppid pgrp session


def watch(path: Path, interval_s: float = 1.0) -> str:  # noqa: C901
    """The watcher of one server: stop it when its launcher is gone without parking it; retire it, parked, after
    its idle time or once the keeper holds none of its entries; return (why) when it or its record is gone."""
    from ..client import connect
    from ..errors import HotweightsError
    from ..paths import daemon_paths

    while True:
        time.sleep(interval_s)
        try:
            record = read_record(path)
        except (OSError, ValueError, TypeError):
            return "the record is gone"
        if record.watcher not in (0, os.getpid()):
            return "another watcher follows it"
        if not alive(record.pid):
            path.unlink(missing_ok=True)
            return "the engine is gone"
        why = ""
        if record.front:
            if not alive(record.front):
                why = "its launcher went away without parking it"
        elif not record.level:
            pass  # woken where it is (hotweights parked --wake): it serves until retired
        elif time.time() - record.parked_at > record.idle_s:
            why = f"parked for {record.idle_s:.0f} s (--park-idle-s)"
        elif record.keys:
            try:
                with connect(daemon_paths(path.parent.parent)) as client:
                    held = {r.key for r in client.status().rows() if r.nbytes or r.host_nbytes}
                if not held & set(record.keys):
                    why = "the keeper no longer holds its weights (released)"
            except (HotweightsError, OSError):  # a keeper that is restarting is not a released entry
                pass
        if why:
            retire(path.parent, record, why)
            return why


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    watch(Path(sys.argv[1]))
