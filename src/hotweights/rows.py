"""One keeper entry as ``status`` shows it (``EntryRow``): a map on the wire, typed here, with its two encoded
fields read in one place (``parked_on``, ``rank``). Stdlib only; ``protocol.StatusOk.rows()`` builds them.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from .errors import ProtocolError

_ROW_TYPES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": (int, float)}
_ROW_SHAPES = {"tp": re.compile(r"\d+/\d+"), "parked": re.compile(r"(\d+:\d+(,\d+:\d+)*)?")}
_ROW_STAND_INS = {"arch": "", "tp": "0/1", "num_pools": 0, "num_attaches": 0, "published_at": 0.0, "host_nbytes": 0,
                  "parked": "", "parked_bytes": 0}


@dataclass(frozen=True, slots=True)
class EntryRow:
    """One entry as ``status`` shows it; a map on the wire (``StatusOk.entries``), typed here."""

    key: str  # the key's short form
    model: str
    dtype: str
    arch: str
    layout: str
    device: str
    tp: str  # "rank/size"
    nbytes: int  # pool bytes
    tensor_nbytes: int  # bytes of tensors (what an engine maps as weights)
    num_tensors: int
    num_pools: int
    num_attaches: int
    published_at: float
    host_nbytes: int = 0  # bytes of its host copy (0: none); ``nbytes`` is 0 when only the host copy is left
    parked: str = ""  # "pid:level,..." of the engines parked on it
    parked_bytes: int = 0  # what those engines hold of their own on its device (their residue)

    @property
    def parked_on(self) -> tuple[tuple[int, int], ...]:
        """``(pid, level)`` of each engine parked on this entry (``parked`` on the wire, ``"pid:level,..."``)."""
        return tuple((int(pid), int(level)) for pid, _, level in (note.partition(":") for note in self.parked.split(",")
                                                                  if note))

    @staticmethod
    def parked_text(notes: Iterable[tuple[int, int]]) -> str:
        return ",".join(f"{pid}:{level}" for pid, level in notes)

    @property
    def rank(self) -> tuple[int, int]:
        """``(rank, size)`` of its tensor parallelism (``tp`` on the wire, ``"rank/size"``)."""
        rank, _, size = self.tp.partition("/")
        return int(rank), int(size or 1)

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, row: Any) -> EntryRow:
        """A status row; fields an older daemon's row lacks take stand-ins (``tensor_nbytes``: its pool
        bytes). ProtocolError names a missing or mistyped field."""
        if not isinstance(row, dict):
            raise ProtocolError(f"status row is not a map: {str(row)[:80]}", code="bad_reply")
        stand_ins = {**_ROW_STAND_INS, "tensor_nbytes": row.get("nbytes")}
        values: dict[str, Any] = {}
        for f in fields(cls):
            value: Any = row.get(f.name, stand_ins.get(f.name))
            want = _ROW_TYPES[str(f.type)]
            if not isinstance(value, want) or isinstance(value, bool):
                raise ProtocolError(f"status row field {f.name!r} must be {f.type}, got {type(value).__name__}",
                                    code="bad_reply")
            values[f.name] = float(typing.cast(float, value)) if f.type == "float" else value
        for name, shape in _ROW_SHAPES.items():
            if not shape.fullmatch(values[name]):
                raise ProtocolError(f"status row field {name!r} is malformed: {values[name][:80]!r}", code="bad_reply")
        return cls(**values)
