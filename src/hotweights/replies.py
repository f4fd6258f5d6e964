"""What a client reads back from the daemon for an attach: outcomes as values, and the
two-step attach reply (pools and fds first, the validated message after).

Every reply is checked against what was asked before anything is mapped: pools on the
key's device, one fd per pool, each fd what its pool claims (``pools/fds.py``); then the
manifest must carry the requested key and the pools handed out (``WrongEntry`` if not).
Stdlib + msgpack only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .errors import ManifestError, ProtocolError, WrongEntry
from .key import CacheKey, FieldDiff
from .manifest import Manifest, PoolSpec
from .pools.fds import host_pools, pool_fds_problem
from .codec import unpack
from .protocol import AttachMismatch, AttachMiss, AttachOk, Error, decode_body
from .wire import close_fds


class Outcome(enum.StrEnum):
    """What an attach came to; the fallback policy reads it."""

    OK = "ok"
    MISS = "miss"  # the daemon holds no entry for the key
    MISMATCH = "mismatch"  # it holds one for something else (``diffs`` says what)
    ABSENT = "absent"  # no daemon answered, or it failed the request
    UNUSABLE = "unusable"  # an entry was found but cannot be used here (memory, pools, model)


@dataclass(frozen=True, slots=True)
class Answer:
    """A validated attach (or lookup) reply: ok with its manifest (a lookup: its size only), or why not."""

    outcome: Outcome
    manifest: Manifest | None = None
    reason: str = ""
    diffs: tuple[FieldDiff, ...] = ()
    nbytes: int = 0  # pool bytes of the entry, when ok


def answer_of(key: CacheKey, reply: object) -> Answer | None:
    """The miss or mismatch ``reply`` means for ``key``; None for any other reply."""
    if isinstance(reply, AttachMiss):
        return Answer(Outcome.MISS, reason=f"cache miss for {key.model} [{key.short}]: {reply.reason}")
    if isinstance(reply, AttachMismatch):
        return Answer(Outcome.MISMATCH, diffs=tuple(FieldDiff.from_wire(line) for line in reply.diffs),
                      reason=f"cached entry {reply.model} [{reply.key_short}] differs: " + "; ".join(reply.diffs))
    return None


class AttachReply:
    """An ``attach`` reply read in two steps, so a caller can map pools before validating.

    ``pools`` are the pool specs of an ``attach_ok`` frame (already checked to be on the
    key's device), ``take_fds()`` hands their fds over, ``answer()`` validates the whole
    reply and checks it against the key and the pools handed out. Fds not taken are
    closed by ``answer()`` or ``close()``.
    """

    def __init__(self, key: CacheKey, payload: bytes, fds: list[int], *, host: bool = False) -> None:
        """``host``: the reply to an attach of the host copy (its fds are memfds of the pools' sizes)."""
        self.key = key
        self._fds = fds
        self._nfds = len(fds)
        self._given: list[PoolSpec] = []
        try:
            self._body = unpack(payload)  # once: pools are read from it, then it is validated
            self.pools = _attach_ok_pools(self._body, len(fds))
        except BaseException:
            self.close()
            raise
        if any(p.device != key.device for p in self.pools):
            self.close()
            raise WrongEntry(f"daemon answered pools on {self.pools[0].device} for a key on {key.device}")
        if self.pools and (problem := pool_fds_problem(host_pools(self.pools) if host else self.pools, self._fds)):
            self.close()
            raise ProtocolError(f"daemon sent a pool this engine will not map: {problem}", code="bad_pool")

    def take_fds(self) -> list[int]:
        fds, self._fds = self._fds, []
        self._given = list(self.pools)
        return fds

    def answer(self) -> Answer:
        try:
            reply = decode_body(self._body)
            if isinstance(reply, Error):
                raise ProtocolError(f"daemon refused attach: {reply.message}", code=reply.code)
            if not self._nfds and (not_served := answer_of(self.key, reply)) is not None:
                return not_served
            if not isinstance(reply, AttachOk) or self._nfds != len(reply.manifest.pools):
                raise ProtocolError(f"bad attach reply {type(reply).__name__} with {self._nfds} fds",
                                    code="bad_reply")
            # the daemon must never serve another key, nor other pools than those handed out
            if reply.manifest.key != self.key or (self._given and list(reply.manifest.pools) != self._given):
                raise WrongEntry(f"daemon answered key {reply.manifest.key.short} for {self.key.short}")
            return Answer(Outcome.OK, reply.manifest, nbytes=reply.manifest.nbytes)
        finally:
            self.close()

    def close(self) -> None:
        close_fds(self._fds)
        self._fds = []


def _attach_ok_pools(body: Any, nfds: int) -> list[PoolSpec]:
    """The pool specs of an ``attach_ok`` body with one fd per pool; [] otherwise
    (``answer()`` then says what is wrong)."""
    try:
        if not (isinstance(body, dict) and body.get("op") == "attach_ok"):
            return []
        pools = [PoolSpec(n, d) for n, d in body["manifest"]["pools"]]
    except (ValueError, TypeError, KeyError, ManifestError):
        return []
    return pools if len(pools) == nfds else []
