"""What an entry holds: pools (shareable allocations) and the tensors laid out in them.

Pure data, stdlib only, validated when built: a ``TensorSpec`` rejects an unknown
dtype, a negative or overflowing shape/stride, or a byte count that does not match
its shape; a ``Manifest`` rejects a tensor that reaches beyond its pool, a duplicate
name, or an alias to nothing. The daemon validates every published manifest this way
before it keeps a single fd, so it never serves a tensor the bytes cannot back.

Not covered: that the bytes are the right bytes. That is the cache key's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import ManifestError
from .key import CacheKey

# dtype name (torch's spelling without "torch.") -> bytes per element
DTYPE_ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
MAX_NBYTES = 1 << 50  # 1 PiB: anything larger is a lie, not a checkpoint
MAX_RANK = 16

# what one manifest may hold: bounds the work and memory of one publish
MAX_COUNTS = {"pools": 4096, "tensors": 1 << 20, "aliases": 1 << 20}
MAX_DIMS = 32


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One shareable allocation. ``device`` is ``cpu`` or ``cuda:<GPU-UUID>``."""

    nbytes: int
    device: str

    def __post_init__(self) -> None:
        if type(self.nbytes) is not int or not 0 < self.nbytes <= MAX_NBYTES:
            raise ManifestError(f"pool nbytes must be in 1..{MAX_NBYTES}, got {self.nbytes!r}")
        if not (isinstance(self.device, str) and (self.device == "cpu" or self.device.startswith("cuda:"))):
            raise ManifestError(f"pool device must be 'cpu' or 'cuda:<uuid>', got {self.device!r}")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A strided view into one pool; ``offset`` and ``nbytes`` are in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    pool: int
    offset: int
    nbytes: int

    def __post_init__(self) -> None:
        # fast path: one pass of cheap checks (attach validates hundreds of these per start);
        # anything odd goes to _explain, which names the exact problem
        itemsize = DTYPE_ITEMSIZE.get(self.dtype)
        shape, stride, offset = self.shape, self.stride, self.offset
        ok = (itemsize is not None and len(shape) == len(stride) <= MAX_RANK and type(offset) is int
              and offset >= 0 and not offset % itemsize and type(self.pool) is int and self.pool >= 0)
        span = 1
        if ok:
            for d, s in zip(shape, stride):
                if type(d) is not int or type(s) is not int or d < 0 or s < 0:
                    ok = False
                    break
                span += (d - 1) * s
            if ok and 0 in shape:
                span = 0
        if not ok or itemsize is None or span * itemsize > MAX_NBYTES or self.nbytes != span * itemsize:
            self._explain()

    def _explain(self) -> None:
        where = f"tensor {self.name!r}"
        itemsize = DTYPE_ITEMSIZE.get(self.dtype)
        if itemsize is None:
            raise ManifestError(f"{where}: unknown dtype {self.dtype!r}; known: {sorted(DTYPE_ITEMSIZE)}")
        if len(self.shape) != len(self.stride) or len(self.shape) > MAX_RANK:
            raise ManifestError(f"{where}: shape {self.shape} and stride {self.stride} must have one rank "
                                f"<= {MAX_RANK}")
        if any(type(d) is not int or d < 0 for d in self.shape + self.stride):
            raise ManifestError(f"{where}: shape {self.shape} / stride {self.stride} must be non-negative ints")
        if type(self.offset) is not int or self.offset < 0 or self.offset % itemsize:
            raise ManifestError(f"{where}: offset {self.offset} must be a non-negative multiple of {itemsize}")
        if type(self.pool) is not int or self.pool < 0:
            raise ManifestError(f"{where}: pool index {self.pool!r} must be a non-negative int")
        span = self.span_elements()
        if span * itemsize > MAX_NBYTES:
            raise ManifestError(f"{where}: shape {self.shape} with stride {self.stride} overflows")
        raise ManifestError(
            f"{where}: nbytes {self.nbytes} != {span * itemsize} implied by shape {self.shape}, "
            f"stride {self.stride}, dtype {self.dtype}"
        )

    def span_elements(self) -> int:
        """Elements from the first to one past the last addressed element."""
        if any(d == 0 for d in self.shape):
            return 0
        return 1 + sum((d - 1) * s for d, s in zip(self.shape, self.stride))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_wire(self) -> list[Any]:
        return [self.name, self.dtype, list(self.shape), list(self.stride), self.pool, self.offset, self.nbytes]

    @classmethod
    def from_wire(cls, value: Any) -> TensorSpec:
        if not (isinstance(value, list) and len(value) == 7):
            raise ManifestError("tensor must be [name, dtype, shape, stride, pool, offset, nbytes]")
        name, dtype, shape, stride, pool, offset, nbytes = value
        if not (isinstance(name, str) and isinstance(dtype, str) and isinstance(shape, list)
                and isinstance(stride, list) and len(shape) <= MAX_DIMS and len(stride) <= MAX_DIMS):
            raise ManifestError(f"tensor {str(value[0])[:80]!r}: fields of the wrong type (or over {MAX_DIMS} dims)")
        return cls(name, dtype, tuple(shape), tuple(stride), pool, offset, nbytes)


@dataclass(frozen=True, slots=True)
class Manifest:
    """Key + pools + tensors + aliases (tied weights: alias name -> tensor name)."""

    key: CacheKey
    pools: tuple[PoolSpec, ...]
    tensors: tuple[TensorSpec, ...]
    aliases: dict[str, str] = field(default_factory=dict)
    load_s: float = 0.0

    def __post_init__(self) -> None:  # noqa: C901
        errors: list[str] = []
        names: set[str] = set()
        for t in self.tensors:
            if t.name in names:
                errors.append(f"tensor {t.name!r} appears twice")
            names.add(t.name)
            if t.pool >= len(self.pools):
                errors.append(f"tensor {t.name!r}: pool {t.pool} does not exist ({len(self.pools)} pools)")
            elif t.offset + t.nbytes > self.pools[t.pool].nbytes:
                errors.append(
                    f"tensor {t.name!r}: bytes {t.offset}..{t.offset + t.nbytes} exceed pool {t.pool} "
                    f"of {self.pools[t.pool].nbytes} bytes"
                )
        for alias, target in self.aliases.items():
            if alias in names:
                errors.append(f"alias {alias!r} is also a tensor name")
            if target not in names:
                errors.append(f"alias {alias!r} points to missing tensor {target!r}")
        if self.pools and len({p.device for p in self.pools}) != 1:
            errors.append(f"pools span several devices {sorted({p.device for p in self.pools})}")
        if self.pools and self.pools[0].device.split(":")[0] != self.key.device_kind:
            errors.append(f"pool device {self.pools[0].device} does not match key device {self.key.device}")
        if errors:
            raise ManifestError("bad manifest: " + "; ".join(errors))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pools)

    @property
    def tensor_nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_wire(self) -> dict[str, Any]:
        return {
            "key": self.key.to_wire(),
            "pools": [[p.nbytes, p.device] for p in self.pools],
            "tensors": [t.to_wire() for t in self.tensors],
            "aliases": dict(self.aliases),
            "load_s": float(self.load_s),
        }

    @classmethod
    def from_wire(cls, value: Any) -> Manifest:
        if not isinstance(value, dict) or set(value) != {"key", "pools", "tensors", "aliases", "load_s"}:
            raise ManifestError("manifest must be a map of key, pools, tensors, aliases, load_s")
        counts = [(name, len(value[name]), limit) for name, limit in MAX_COUNTS.items()
                  if isinstance(value[name], (list, dict)) and len(value[name]) > limit]
        if counts:
            raise ManifestError("; ".join(f"manifest has {n} {name}; at most {limit} are accepted"
                                          for name, n, limit in counts))
        try:
            key = CacheKey.from_wire(value["key"])
        except ValueError as exc:
            raise ManifestError(f"manifest key: {exc}") from None
        pools_raw, tensors_raw, aliases = value["pools"], value["tensors"], value["aliases"]
        if not (isinstance(pools_raw, list) and isinstance(tensors_raw, list) and isinstance(aliases, dict)):
            raise ManifestError("manifest pools/tensors must be lists and aliases a map")
        if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[1], str) for p in pools_raw):
            raise ManifestError("each pool must be [nbytes, device]")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
            raise ManifestError("aliases must map str to str")
        load_s = value["load_s"]
        if not isinstance(load_s, (int, float)):
            raise ManifestError("load_s must be a number")
        return cls(
            key=key,
            pools=tuple(PoolSpec(p[0], p[1]) for p in pools_raw),
            tensors=tuple(TensorSpec.from_wire(t) for t in tensors_raw),
            aliases=dict(aliases),
            load_s=float(load_s),
        )


def pack(items: list[tuple[str, str, tuple[int, ...]]], *, pool_bytes: int, device: str,
         align: int = 256) -> tuple[tuple[PoolSpec, ...], tuple[TensorSpec, ...]]:
    """Lay contiguous tensors ``(name, dtype, shape)`` out in as few pools as possible.

    Pools are filled in order up to ``pool_bytes``; a tensor larger than that gets a
    pool of its own. Few large pools keep attach fast: mapping cost is per pool.
    """
    pools: list[int] = []
    specs: list[TensorSpec] = []
    used = 0
    for name, dtype, shape in items:
        itemsize = DTYPE_ITEMSIZE.get(dtype)
        if itemsize is None:
            raise ManifestError(f"tensor {name!r}: unknown dtype {dtype!r}")
        stride, acc = [], 1
        for d in reversed(shape):
            stride.append(acc)
            acc *= d
        nbytes = acc * itemsize
        start = -(-used // align) * align
        if not pools or (start + nbytes > pool_bytes and used > 0):
            pools.append(0)
            start = 0
        used = start + nbytes
        pools[-1] = max(pools[-1], used)
        specs.append(TensorSpec(name, dtype, tuple(shape), tuple(reversed(stride)), len(pools) - 1, start, nbytes))
    pool_specs = tuple(PoolSpec(max(n, align), device) for n in pools)
    return pool_specs, tuple(specs)
