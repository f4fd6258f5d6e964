"""Frames on a Unix stream socket: length-prefixed bytes with file descriptors.

Frame = 4-byte big-endian length + payload (one msgpack map, see ``protocol.py``). File
descriptors travel as ``SCM_RIGHTS`` ancillary data on the frame's first bytes. Checks
run cheapest and most dangerous first: the length is checked against
``MAX_FRAME_BYTES`` before a body byte is read, ancillary truncation (``MSG_CTRUNC``) is
an error, and every fd received is closed on every error path.

Stdlib only. Not covered: what a payload means (``protocol.py``).
"""

from __future__ import annotations

import array
import os
import socket
import struct

from .errors import ProtocolError

MAX_FRAME_BYTES = 32 << 20  # a 100k-tensor manifest is ~15 MiB
MAX_FDS_PER_FRAME = 253  # Linux SCM_MAX_FD
_HEADER = struct.Struct(">I")
_FD_SIZE = array.array("i").itemsize


def send_frame(sock: socket.socket, payload: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
    if len(fds) > MAX_FDS_PER_FRAME:
        raise ProtocolError(f"{len(fds)} fds exceed MAX_FDS_PER_FRAME={MAX_FDS_PER_FRAME}")
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = sock.sendmsg([data], ancillary)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_frame(sock: socket.socket) -> tuple[bytes, list[int]]:
    """Raise EOFError on a clean close before a frame starts, ProtocolError on a broken frame."""
    fds: list[int] = []
    try:
        header = bytearray()
        while len(header) < _HEADER.size:
            chunk, ancdata, flags, _ = sock.recvmsg(
                _HEADER.size - len(header), socket.CMSG_SPACE(MAX_FDS_PER_FRAME * _FD_SIZE)
            )
            fds.extend(_fds_from(ancdata))
            if flags & socket.MSG_CTRUNC:
                raise ProtocolError(f"more than {MAX_FDS_PER_FRAME} fds in one frame", code="too_many_fds")
            if not chunk:
                if not header and not fds:
                    raise EOFError("peer closed the connection")
                raise ProtocolError("connection closed inside a frame header", code="truncated")
            header += chunk
        (length,) = _HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ProtocolError(
                f"frame length {length} exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}", code="frame_too_large"
            )
        body = bytearray(length)
        view = memoryview(body)
        got = 0
        while got < length:
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ProtocolError(f"connection closed after {got} of {length} frame bytes", code="truncated")
            got += n
        return bytes(body), fds
    except BaseException:
        close_fds(fds)
        raise


def _fds_from(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _FD_SIZE
            fds.extend(array.array("i", data[:usable]))
    return fds


def close_fds(fds: list[int] | tuple[int, ...]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
