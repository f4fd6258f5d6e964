"""What a running front makes of a configuration (``config.py``'s schema, checked already): at its start, the eager
models whose engines cannot park started on their first request instead (``started_when_asked``); at a reload (SIGHUP,
``hotweights switch reload``, ``--watch-config``), where the file is read again (``ConfigSource``) and what the new
one changes (``diff``: a ``Reload``), or why it cannot be run. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from .config import ConfigError, SwitchConfig
from .kinds import KINDS


# not while it runs: where it listens, its keeper, its logs, how its engines were made
FIXED_KEYS = ("host", "port", "socket_dir", "log_dir", "parking", "preload_jobs", "start_jobs", "keep_kv",
              "held_kv")


@dataclasses.dataclass(frozen=True)
class Reload:
    """What a new configuration changes in a running front (``diff``): models added, removed, and changed (their
    table differs: stopped and started again), by name; the others are untouched."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def line(self) -> str:
        parts = [f"{what} {', '.join(names)}" for what, names in
                 (("added", self.added), ("removed", self.removed), ("changed", self.changed)) if names]
        return "; ".join(parts) or "no model changed"


def diff(old: SwitchConfig, new: SwitchConfig) -> tuple[SwitchConfig, Reload]:
    """``new`` as a front running ``old`` runs it (``preload_jobs``/``start_jobs`` at 0, auto, are the running
    ones), and what it changes; ConfigError (one line) where it changes what a running front cannot
    (``FIXED_KEYS``: where it listens, its keeper's directory, its logs, parking): restart the front for those."""
    new = dataclasses.replace(new, preload_jobs=new.preload_jobs or old.preload_jobs,
                              start_jobs=new.start_jobs or old.start_jobs)
    fixed = [key for key in FIXED_KEYS if getattr(old, key) != getattr(new, key)]
    if fixed:
        raise ConfigError(f"{', '.join(fixed)} cannot change while the front runs (restart it for that); the running "
                          f"configuration stays")
    before, after = {m.name: m for m in old.models}, {m.name: m for m in new.models}
    return new, Reload(tuple(n for n in after if n not in before), tuple(n for n in before if n not in after),
                       tuple(n for n in after if n in before and after[n] != before[n]))


@dataclasses.dataclass(frozen=True)
class ConfigSource:
    """Where a running front reads its configuration again (a reload): the file, how it is read (the file's tables
    with the command line's flags over them), and whether the front watches the file for changes."""

    path: Path
    read: Callable[[], SwitchConfig]
    watch: bool = False


def started_when_asked(config: SwitchConfig) -> tuple[SwitchConfig, list[str]]:
    """``config`` with each eager model whose engine cannot park (vLLM's CPU build has no sleep mode, or parking
    is off) and that need not be awake (not the default, not kept awake) made ``cached``: started by its first
    request (preloaded at start-up where preloads run ahead of the starts). Start-up would otherwise start it
    only to stop it at once (a park stops such an engine), minutes of vLLM start for nothing. The names of those
    it changed."""
    changed = [m.name for m in config.models if m.start == "eager" and m is not config.default and not m.keep_awake
               and not KINDS[m.engine].parks(config.parking)]
    models = tuple(dataclasses.replace(m, start="cached") if m.name in changed else m for m in config.models)
    return (dataclasses.replace(config, models=models) if changed else config), changed
