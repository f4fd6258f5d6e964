"""One codec for message tables: typed frozen dataclasses tagged by ``op``, packed as msgpack maps.

``Codec(table)`` encodes a message into a map and decodes one back, rejecting unknown ops, missing or
extra fields and wrong types by name. The keeper's table is ``protocol.MESSAGES``; the standby has its
own (``standby/messages.py``). No pickle. Framing and fds live in ``wire.py``.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, Field, fields
from typing import Any

import msgpack

from .errors import ManifestError, ProtocolError
from .key import CacheKey
from .manifest import Manifest


class Codec:
    """One message table, and messages encoded and decoded by it: ``op`` tags, strict fields, wire types.

    Fields added later carry a default: a peer of the same protocol version that predates them omits
    them, and they are sent only when they differ from it, so a peer that predates them reads the
    message as before. The keeper's table is ``MESSAGES``; the standby has its own (``standby/messages.py``).
    """

    def __init__(self, messages: dict[str, type]) -> None:
        self.messages = messages
        self.ops = {cls: op for op, cls in messages.items()}
        # field -> the type its wire value must have (``list[str]`` is checked as a list; its items by the reader)
        self.hints = {cls: {name: typing.get_origin(hint) or hint for name, hint in typing.get_type_hints(cls).items()}
                      for cls in messages.values()}
        self.defaults = {cls: {f.name: _default(f) for f in fields(cls)
                               if f.default is not MISSING or f.default_factory is not MISSING}
                         for cls in messages.values()}

    def encode(self, msg: Any) -> bytes:
        body: dict[str, Any] = {"op": self.ops[type(msg)]}
        defaults = self.defaults[type(msg)]
        for f in fields(msg):
            value = getattr(msg, f.name)
            if f.name in defaults and value == defaults[f.name]:
                continue
            if isinstance(value, Manifest):
                value = _manifest_wire(value)
            elif isinstance(value, CacheKey):
                value = value.to_wire()
            body[f.name] = value
        return msgpack.packb(body, use_bin_type=True)

    def decode(self, data: bytes) -> Any:
        """Bytes -> message; ProtocolError names the op and field on any violation."""
        return self.decode_body(unpack(data))

    def decode_body(self, body: Any) -> Any:
        """An unpacked frame -> message (``body`` is consumed)."""
        if not isinstance(body, dict):
            raise ProtocolError("frame is not a msgpack map", code="bad_frame")
        if not all(isinstance(k, str) for k in body):
            raise ProtocolError("frame field names must be strings", code="bad_message")
        op = body.pop("op", None)
        cls = self.messages.get(op) if isinstance(op, str) else None
        if cls is None:
            raise ProtocolError(f"unknown op {op!r}; known ops: {sorted(self.messages)}", code="unknown_op")
        hints = self.hints[cls]
        extra = sorted(set(body) - set(hints))
        missing = sorted(set(hints) - set(body) - set(self.defaults[cls]))
        if extra or missing:
            raise ProtocolError(f"op {op!r}: unexpected fields {extra}, missing fields {missing}", code="bad_message")
        return cls(**{name: _convert(op, name, body[name], hint) for name, hint in hints.items() if name in body})


def _default(f: Field[Any]) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]


# The daemon sends the same manifest on every attach; manifests are immutable, so their
# wire form is built once (identity-checked, a few kept).
_WIRE: dict[int, tuple[Manifest, dict[str, Any]]] = {}


def _manifest_wire(manifest: Manifest) -> dict[str, Any]:
    hit = _WIRE.get(id(manifest))
    if hit is not None and hit[0] is manifest:
        return hit[1]
    wire = manifest.to_wire()
    if len(_WIRE) >= 16:
        _WIRE.pop(next(iter(_WIRE)), None)
    _WIRE[id(manifest)] = (manifest, wire)
    return wire


def unpack(data: bytes) -> Any:
    """Frame bytes -> msgpack value; ProtocolError if they are not msgpack."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=1 << 20, max_ext_len=0,
                               max_str_len=1 << 20, max_array_len=1 << 20, max_map_len=1 << 20)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"frame is not valid msgpack: {exc}", code="bad_frame") from None


def _convert(op: str, name: str, value: Any, hint: Any) -> Any:
    try:
        if hint is CacheKey:
            return CacheKey.from_wire(value)
        if hint is Manifest:
            return Manifest.from_wire(value)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError, ManifestError) as exc:
        raise ProtocolError(f"op {op!r} field {name!r}: {exc}", code="bad_message") from None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) if hint is float else (
        type(value) is hint if hint in (int, bool) else isinstance(value, hint))
    if not ok:
        raise ProtocolError(
            f"op {op!r} field {name!r} must be {hint.__name__}, got {type(value).__name__}", code="bad_message"
        )
    return float(value) if hint is float else value
