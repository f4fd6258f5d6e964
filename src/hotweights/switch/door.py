"""The switch's one door for its port (``port/``: the HTTP front, its handlers and streams): ``SwitchPort``, what
the port may ask of the scheduler and its models, and ``Unavailable``, what a request that cannot be served gets.
``switcher.Switcher`` is the one implementation; the port imports neither the lifecycle nor the admission behind
it. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .config import SwitchConfig
from .running import Reload
from .model import Model


class Unavailable(Exception):
    """A request that cannot be served now (503); the message says why."""


class SwitchPort(Protocol):
    """What the port asks of the switch."""

    @property
    def models(self) -> Mapping[str, Model]: ...  # read by the port: names, configs, states, rows

    @property
    def config(self) -> SwitchConfig: ...  # the front's settings (a held stream's due time: the SLO's)

    async def acquire(self, name: str, due: float | None = None) -> Model:
        """The awake engine of ``name`` with this request counted in flight; Unavailable when it cannot be. ``due``:
        a held stream's next token's due time (``time.monotonic()``)."""
        ...

    def release(self, m: Model) -> None:
        """A request on ``m``'s engine ended."""
        ...

    async def engine_gone(self, m: Model) -> bool:
        """Whether ``m``'s engine is gone (its connection failed): marked failed by the scheduler if so."""
        ...

    async def act(self, name: str, what: str) -> str:
        """An operator's action (``actions.ACTIONS``) on model ``name``: what it did (``actions.Refused``)."""
        ...

    async def unload(self) -> dict[str, str]:
        """Every model's engine stopped (llama-swap's ``/unload``): what was done to each, by name."""
        ...

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the front serves (start-up reached the default model, and it has not failed), and why not: the
        default model, its state, the reason, and when it is tried again, as ``/health`` answers them."""
        ...

    def status(self, gpu: dict[int, int]) -> dict[str, Any]:
        """Each model's row (``gpu``: MiB held per pid) and the last switches, for ``/switch/status``."""
        ...

    def keep_alive(self, name: str, seconds: float) -> None:
        """A request's ``keep_alive`` (Ollama's): model ``name`` parks once idle this long, from now on (``inf``:
        never for idleness), in place of its ``park_after_s``."""
        ...

    async def reload(self, config: SwitchConfig) -> tuple[SwitchConfig, Reload]:
        """A new configuration, as the switch runs it, and what it changed (``config.diff``); ConfigError (one line,
        nothing changed) where it cannot be run."""
        ...

    def close(self) -> int:
        """The front stops: every request waiting for its model is answered 503 now (how many waited)."""
        ...

    async def stop(self) -> None:
        """Every engine stopped."""
        ...
