"""The cache key: equal keys mean "these bytes are exactly what this engine would load".

Pure data, stdlib only (the daemon imports it). Built by the loader from the
checkpoint (``hotweights.loading.checkpoint.checkpoint_key``); compared field by field
by the daemon, which answers a near miss with ``diff``: one ``FieldDiff`` per differing
field, whose text (``dtype: cached=float16 requested=bfloat16``) is what the wire carries.

Deliberately NOT in the key: the model's path (the same checkpoint copied elsewhere
still matches; ``model`` is display-only), and data-parallel size/rank (replicas of a
dense model hold identical bytes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from typing import Any

LAYOUT_CHECKPOINT = "checkpoint"
MAX_SHARDS = 16384  # checkpoint files per key: bounds what one request can make the daemon compare


def pool_device(kind: str, device_id: str) -> str:
    """The one spelling of a device's identity in pools, keys and ``status``: ``cpu`` or ``cuda:<GPU UUID>``."""
    return "cpu" if kind == "cpu" else f"cuda:{device_id}"


@dataclass(frozen=True, slots=True)
class FieldDiff:
    """One field where a cached key differs from a requested one; ``str`` is the wire's line."""

    field: str  # "dtype", or "shards[<name>].content_digest"
    cached: str
    requested: str

    def __str__(self) -> str:
        return f"{self.field}: cached={self.cached} requested={self.requested}"

    @classmethod
    def from_wire(cls, line: str) -> FieldDiff:
        """The diff a mismatch reply carries as text (the wire keeps lines); a line of another
        shape (the daemon's ``... and N more differences``) keeps its text as ``field``."""
        name, sep, rest = line.partition(": cached=")
        cached, sep2, requested = rest.rpartition(" requested=")
        return cls(name, cached, requested) if sep and sep2 else cls(line, "", "")


@dataclass(frozen=True, slots=True)
class ShardId:
    """One safetensors file: relative name, size, digest of its raw header, digest of its bytes."""

    name: str
    size: int
    header_digest: str
    content_digest: str

    def to_wire(self) -> list[Any]:
        return [self.name, self.size, self.header_digest, self.content_digest]

    @classmethod
    def from_wire(cls, value: Any) -> ShardId:
        if not (isinstance(value, list) and len(value) == 4):
            raise ValueError("shard must be [name, size, header_digest, content_digest]")
        name, size, header_digest, content_digest = value
        if not (isinstance(name, str) and type(size) is int and isinstance(header_digest, str)
                and isinstance(content_digest, str)):
            raise ValueError(f"shard {str(value)[:80]} has fields of the wrong type")
        return cls(name, size, header_digest, content_digest)


@dataclass(frozen=True, slots=True)
class CacheKey:
    shards: tuple[ShardId, ...]
    arch: str
    dtype: str
    quantization: str = "none"
    quantization_digest: str = ""
    revision: str = ""
    layout: str = LAYOUT_CHECKPOINT
    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    expert_placement: str = ""
    device_kind: str = "cpu"
    device_id: str = "host"
    model: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.shards:
            raise ValueError("CacheKey.shards is empty: a key needs at least one checkpoint file")
        if self.device_kind not in ("cpu", "cuda"):
            raise ValueError(f"CacheKey.device_kind must be 'cpu' or 'cuda', got {self.device_kind!r}")
        for name in ("tp_size", "pp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"CacheKey.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.tp_rank < self.tp_size or not 0 <= self.pp_rank < self.pp_size:
            raise ValueError(
                f"CacheKey ranks out of range: tp {self.tp_rank}/{self.tp_size}, pp {self.pp_rank}/{self.pp_size}"
            )

    @property
    def short(self) -> str:
        """12 hex characters that name this key in logs and in ``hotweights status``."""
        return hashlib.blake2b(repr(self._identity()).encode(), digest_size=6).hexdigest()

    @property
    def device(self) -> str:
        return pool_device(self.device_kind, self.device_id)

    def _identity(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.compare)

    def diff(self, requested: CacheKey) -> list[FieldDiff]:
        """Every field where ``self`` (cached) differs from ``requested``."""
        diffs: list[FieldDiff] = []
        for f in fields(self):
            if not f.compare or f.name == "shards":
                continue
            cached, wanted = getattr(self, f.name), getattr(requested, f.name)
            if cached != wanted:
                diffs.append(FieldDiff(f.name, str(cached), str(wanted)))
        diffs.extend(_diff_shards(self.shards, requested.shards))
        return diffs

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["shards"] = [s.to_wire() for s in self.shards]
        return out

    @classmethod
    def from_wire(cls, value: Any) -> CacheKey:
        """Build from a decoded map; rejects unknown or missing fields and wrong types by name."""
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ValueError("key must be a map with string field names")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(value) - set(known))
        missing = sorted(set(known) - set(value))
        if unknown or missing:
            raise ValueError(f"key fields: unknown {unknown}, missing {missing}")
        kwargs: dict[str, Any] = {}
        for name, f in known.items():
            item = value[name]
            if name == "shards":
                if not isinstance(item, list):
                    raise ValueError("key.shards must be a list")
                if len(item) > MAX_SHARDS:
                    raise ValueError(f"key.shards has {len(item)} entries; at most {MAX_SHARDS} are accepted")
                kwargs[name] = tuple(ShardId.from_wire(s) for s in item)
                continue
            expected = int if f.type == "int" else str
            if type(item) is not expected:
                raise ValueError(f"key.{name} must be {expected.__name__}, got {type(item).__name__}")
            kwargs[name] = item
        return cls(**kwargs)


def _diff_shards(cached: tuple[ShardId, ...], requested: tuple[ShardId, ...]) -> list[FieldDiff]:
    diffs: list[FieldDiff] = []
    by_name = {s.name: s for s in cached}
    wanted_names = {s.name for s in requested}
    for name in sorted(set(by_name) - wanted_names):
        diffs.append(FieldDiff(f"shards[{name}]", "present", "absent"))
    for shard in requested:
        old = by_name.get(shard.name)
        if old is None:
            diffs.append(FieldDiff(f"shards[{shard.name}]", "absent", "present"))
            continue
        for attr in ("size", "header_digest", "content_digest"):
            a, b = getattr(old, attr), getattr(shard, attr)
            if a != b:
                diffs.append(FieldDiff(f"shards[{shard.name}].{attr}", str(a), str(b)))
    return diffs
