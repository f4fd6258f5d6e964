"""What a launcher and a standby say to each other: typed messages, decoded through the protocol's codec.

Wire: ``wire`` frames (4-byte length + msgpack map), fds by ``SCM_RIGHTS``. launcher -> ``Hello``;
standby -> ``Ready``; launcher -> ``Start`` with fds 0, 1, 2 (or ``Stop``: retire); standby ->
``Started`` (the server's pid, leader of its own process group), later ``Exited`` (its code).
"""

from __future__ import annotations

import socket
import typing
from dataclasses import dataclass

from ..errors import ProtocolError
from ..codec import Codec
from ..wire import close_fds, recv_frame, send_frame


@dataclass(frozen=True, slots=True)
class Hello:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    pid: int
    engine: str
    fingerprint: dict[str, str]  # ``Fingerprint.to_wire()``: what its imports were made from
    imports_s: float
    missing: list[str]  # pre-imports this build does not have
    cuda_initialized: bool  # fork safety, checked again before every fork
    threads: int
    native_threads: int


@dataclass(frozen=True, slots=True)
class Start:
    """``python -m MODULE ARGS`` with ``env`` in ``cwd``; carries the launcher's fds 0, 1, 2."""

    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str


@dataclass(frozen=True, slots=True)
class Started:
    pid: int


@dataclass(frozen=True, slots=True)
class Exited:
    code: int


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Message = Hello | Ready | Start | Started | Exited | Stop
CODEC = Codec({"hello": Hello, "ready": Ready, "start": Start, "started": Started, "exited": Exited, "stop": Stop})


def send(sock: socket.socket, msg: Message, fds: list[int] | tuple[int, ...] = ()) -> None:
    send_frame(sock, CODEC.encode(msg), fds)


def receive(sock: socket.socket, *expected: type) -> tuple[Message, list[int]]:
    """The next message, which must be one of ``expected``; EOFError when the peer is gone. The caller owns
    the fds."""
    payload, fds = recv_frame(sock)
    try:
        msg = CODEC.decode(payload)
        if not isinstance(msg, expected):
            raise ProtocolError(f"standby peer sent {type(msg).__name__}; expected "
                                f"{' or '.join(t.__name__ for t in expected)}", code="bad_message")
    except BaseException:
        close_fds(fds)
        raise
    return typing.cast(Message, msg), fds
