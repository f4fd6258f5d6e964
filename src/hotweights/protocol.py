"""The message vocabulary between clients and the daemon: typed messages, one codec.

One frozen dataclass per message, tagged by ``op`` in one table (``MESSAGES``); ``encode`` packs a
message into a msgpack map, ``decode`` rejects unknown ops, missing or extra fields and wrong types
by name (``codec.py``). No pickle. Framing and fds live in ``wire.py``.

Not covered: authentication (``wire.py`` and ``keeper/server.py`` check peers) and what the
fds point at (the daemon checks memfd seals and sizes on publish).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from .codec import Codec
from .key import CacheKey
from .manifest import Manifest
from .rows import EntryRow
from .wire import close_fds, recv_frame, send_frame

PROTOCOL_VERSION = 2  # 2: attach carries the key only
RESTART_EXIT = 75  # EX_TEMPFAIL: the exit status of a daemon asked to restart under its service manager


# -- requests ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    version: int


@dataclass(frozen=True, slots=True)
class Status:
    pass


@dataclass(frozen=True, slots=True)
class Attach:
    """``tier``: ``device`` (the default: what engines map) or ``host``, the host copy a deep-parked engine
    maps its weights again from when the device tier is gone (``keeper/registry.py``)."""

    key: CacheKey
    tier: str = "device"


@dataclass(frozen=True, slots=True)
class Lookup:
    """Whether ``key`` is served, answered as an attach is (``LookupOk`` for ``AttachOk``) but without fds:
    nothing is mapped, and it does not count as an attach."""

    key: CacheKey


@dataclass(frozen=True, slots=True)
class Publish:
    """Carries one fd per ``manifest.pools`` entry, in order; a ``host`` tier's fds are sealed memfds of the
    pools' sizes, whatever device the manifest names."""

    manifest: Manifest
    tier: str = "device"


@dataclass(frozen=True, slots=True)
class Release:
    """Release one entry by its short key, or every entry with ``all``; ``tier``: only that tier ('': both)."""

    key_short: str
    all: bool
    tier: str = ""


@dataclass(frozen=True, slots=True)
class Describe:
    """The manifest of the entry whose short key is ``key_short`` (``DescribeOk``): no fds, not an attach."""

    key_short: str


@dataclass(frozen=True, slots=True)
class Park:
    """The sender is parked on ``key``'s entry at ``level`` (1: weights mapped, 2: unmapped; 0: awake again),
    holding ``held_bytes`` of its own on the key's device (its residue: what a start beside it cannot have)."""

    key: CacheKey
    level: int
    held_bytes: int


@dataclass(frozen=True, slots=True)
class Stop:
    """``restart``: a daemon under a service manager exits with ``RESTART_EXIT`` and leaves its entries in the
    manager's fd store, which starts the (upgraded) daemon again with them."""

    restart: bool = False


@dataclass(frozen=True, slots=True)
class Export:
    """Hand-off (``daemon --replace``): the ``index``-th entry, as an ``ExportOk`` with its fds, or
    ``ExportEnd`` past the last. From the first export on, the daemon refuses publishes."""

    index: int


# -- replies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HelloOk:
    version: int
    daemon_version: str
    pid: int


@dataclass(frozen=True, slots=True)
class StatusOk:
    pid: int
    daemon_version: str
    uptime_s: float
    entries: list[dict[str, Any]]  # ``EntryRow.to_wire()`` each; ``rows()`` reads them
    bytes_by_device: dict[str, int]
    torch_imported: bool
    max_bytes: int = 0  # the daemon's budget (0: none); a field with a default may be absent (older daemons)
    metrics: str = ""  # host:port of its /metrics ("": none)
    service_manager: bool = False  # it keeps its entries in a service manager's fd store (systemd)
    parked_by_device: dict[str, int] = field(default_factory=dict)  # bytes parked engines hold, per device

    def rows(self) -> list[EntryRow]:
        return [EntryRow.from_wire(e) for e in self.entries]


@dataclass(frozen=True, slots=True)
class AttachOk:
    """Carries one fd per pool, dup'd for this client: the client owns and closes them."""

    manifest: Manifest


@dataclass(frozen=True, slots=True)
class LookupOk:
    key_short: str
    nbytes: int  # pool bytes: what a zero-copy attach maps
    tensor_nbytes: int


@dataclass(frozen=True, slots=True)
class AttachMiss:
    reason: str


@dataclass(frozen=True, slots=True)
class AttachMismatch:
    model: str
    key_short: str
    diffs: list[str]


@dataclass(frozen=True, slots=True)
class ExportOk:
    """Carries one fd per pool, dup'd for the new daemon."""

    manifest: Manifest


@dataclass(frozen=True, slots=True)
class ExportEnd:
    pass


@dataclass(frozen=True, slots=True)
class PublishOk:
    key_short: str


@dataclass(frozen=True, slots=True)
class ReleaseOk:
    released: list[str]


@dataclass(frozen=True, slots=True)
class StopOk:
    pass


@dataclass(frozen=True, slots=True)
class ParkOk:
    pass


@dataclass(frozen=True, slots=True)
class DescribeOk:
    manifest: Manifest


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    message: str


Message = (Hello | Status | Attach | Lookup | Publish | Release | Stop | Export | Park | Describe | HelloOk | StatusOk
           | AttachOk | LookupOk | AttachMiss | AttachMismatch | ExportOk | ExportEnd | PublishOk | ReleaseOk | StopOk
           | ParkOk | DescribeOk | Error)

MESSAGES: dict[str, type] = {
    "hello": Hello, "status": Status, "attach": Attach, "lookup": Lookup, "lookup_ok": LookupOk,
    "publish": Publish, "release": Release,
    "stop": Stop, "export": Export, "hello_ok": HelloOk, "status_ok": StatusOk, "attach_ok": AttachOk,
    "attach_miss": AttachMiss, "attach_mismatch": AttachMismatch, "export_ok": ExportOk, "export_end": ExportEnd,
    "publish_ok": PublishOk,
    "release_ok": ReleaseOk, "stop_ok": StopOk, "park": Park, "park_ok": ParkOk, "describe": Describe,
    "describe_ok": DescribeOk, "error": Error,
}


CODEC = Codec(MESSAGES)


def encode(msg: Message) -> bytes:
    return CODEC.encode(msg)


def decode(data: bytes) -> Message:
    """Bytes -> message; ProtocolError names the op and field on any violation."""
    return CODEC.decode(data)  # type: ignore[no-any-return]  # one of MESSAGES


def decode_body(body: Any) -> Message:
    """An unpacked frame -> message (``body`` is consumed)."""
    return CODEC.decode_body(body)  # type: ignore[no-any-return]  # one of MESSAGES


def send_message(sock: socket.socket, msg: Message, fds: list[int] | tuple[int, ...] = ()) -> None:
    send_frame(sock, encode(msg), fds)


def recv_message(sock: socket.socket) -> tuple[Message, list[int]]:
    """One message and the fds that came with it; the caller owns the fds."""
    payload, fds = recv_frame(sock)
    try:
        return decode(payload), fds
    except BaseException:
        close_fds(fds)
        raise
