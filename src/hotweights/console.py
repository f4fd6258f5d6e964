"""Terminal presentation for the CLI: the preload progress bar, the status table, a command's result (text or JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .evidence import GIB


class ProgressBar:
    """A rich progress bar with throughput when stderr is a terminal; a no-op otherwise."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Any:
        if not self.enabled:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        # binary units throughout, as the Published line has them (GiB, GiB/s)
        speed = TextColumn("{task.fields[rate]}")
        self._progress = Progress("[bold]preload", BarColumn(), DownloadColumn(binary_units=True), speed,
                                  TimeRemainingColumn(), transient=True)
        self._progress.start()
        self._task = self._progress.add_task("preload", total=None, rate="")
        return self.update

    def update(self, done: int, total: int) -> None:
        self._progress.update(self._task, completed=done, total=total)
        speed = self._progress.tasks[0].speed
        self._progress.update(self._task, rate=f"{speed / GIB:.2f} GiB/s" if speed else "")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def entries(n: int) -> str:
    """``1 entry``, ``2 entries``."""
    return f"{n} entry" if n == 1 else f"{n} entries"


def status_table(status: Any, socket_path: Path) -> str:
    """``hotweights status`` as text: the daemon line, bytes per device, one row per entry."""
    lines = [f"daemon pid={status.pid} version={status.daemon_version} uptime={status.uptime_s:.0f}s "
             f"socket={socket_path}"]
    for dev, nbytes in sorted(status.bytes_by_device.items()):
        lines.append(f"  {dev}: {nbytes / GIB:.2f} GiB")
    held = sum(status.bytes_by_device.values())
    lines.append(f"  budget: {held / GIB:.2f} of {status.max_bytes / GIB:.2f} GiB (--max-bytes)" if status.max_bytes
                 else "  budget: none (--max-bytes not set)")
    parked = sum(getattr(status, "parked_by_device", {}).values())
    if parked:
        lines.append(f"  parked engines hold {parked / GIB:.2f} GiB of their own")
    lines.append(f"{'KEY':<14}{'MODEL':<20}{'LAYOUT':<14}{'TP':<5}{'DTYPE':<10}{'DEVICE':<16}{'GiB':>8}{'HOST GiB':>9}"
                 f"{'TENSORS':>9}{'ATTACHES':>10}  PARKED (pid:level)")
    rows = status.rows()
    for e in rows:
        lines.append(f"{e.key:<14}{e.model[:19]:<20}{e.layout[:13]:<14}{e.tp:<5}{e.dtype:<10}"
                     f"{e.device[:15]:<16}{e.nbytes / GIB:>8.2f}{e.host_nbytes / GIB:>9.2f}{e.num_tensors:>9}"
                     f"{e.num_attaches:>10}  {e.parked or '-'}")
    if not rows:
        lines.append("(no entries)")
    by_model: dict[str, list[Any]] = {}
    for e in rows:
        by_model.setdefault(e.model, []).append(e)
    for model, entries in sorted(by_model.items()):
        if len(entries) > 1:  # a second dtype or layout is a second copy of the weights
            kinds = ", ".join(f"{e.dtype} {e.layout} on {e.device[:12]}" for e in entries)
            lines.append(f"note: {model} is cached {len(entries)} times ({kinds}): "
                         f"{sum(e.nbytes for e in entries) / GIB:.2f} GiB in all; release what no engine uses "
                         f"(hotweights release KEY)")
    return "\n".join(lines)


def emit(args: Any, data: dict[str, Any], text: str) -> None:
    """A command's result: ``data`` as one JSON line with ``--json``, else ``text``."""
    print(json.dumps(data, sort_keys=True) if getattr(args, "json", False) else text, flush=True)
