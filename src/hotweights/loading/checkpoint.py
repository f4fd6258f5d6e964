"""Safetensors checkpoints: find the shards, validate headers, build the cache key.

A checkpoint is a directory with ``model.safetensors`` or shards listed by
``model.safetensors.index.json``, plus ``config.json``. Headers are parsed and checked
here (length cap, JSON, known dtypes, offsets inside the file and consistent with the
shape) because the key needs the raw header bytes anyway; tensors are then read through
an ``mmap`` of the file with no intermediate copy.

Not covered: ``.bin``/pickle checkpoints (never unpickled), GGUF.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import xxhash

from ..errors import CheckpointError
from ..key import CacheKey, ShardId
from ..manifest import DTYPE_ITEMSIZE
from .digest import DigestCache

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 << 20
ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
TARGET_DTYPES = ("auto", "float16", "bfloat16", "float32")


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """A tensor as stored: byte range ``begin..end`` of the file (absolute offsets)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class Shard:
    path: Path
    name: str
    stat: os.stat_result
    header_bytes: bytes
    _tensors: tuple[StoredTensor, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def tensors(self) -> tuple[StoredTensor, ...]:
        """The stored tensors, parsed and checked from the header on first use."""
        if self._tensors is None:
            object.__setattr__(self, "_tensors", _parse_tensors(self))
        return self._tensors


@dataclass(frozen=True, slots=True)
class Checkpoint:
    directory: Path
    shards: tuple[Shard, ...]
    config: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return sum(s.stat.st_size for s in self.shards)

    def validate(self) -> None:
        """Parse every header and check that no tensor is stored twice."""
        seen: dict[str, str] = {}
        for shard in self.shards:
            for t in shard.tensors:
                if t.name in seen:
                    raise CheckpointError(f"tensor {t.name!r} is stored in both {seen[t.name]} and {shard.name}")
                seen[t.name] = shard.name

    @property
    def arch(self) -> str:
        archs = self.config.get("architectures") or [self.config.get("model_type", "unknown")]
        return str(archs[0])

    def resolve_dtype(self, dtype: str) -> str:
        """``auto`` -> the config's dtype, else the most common floating dtype stored."""
        if dtype not in TARGET_DTYPES:
            raise CheckpointError(f"unsupported dtype {dtype!r}; use one of {', '.join(TARGET_DTYPES)}")
        if dtype != "auto":
            return dtype
        configured = self.config.get("torch_dtype") or self.config.get("dtype")
        if isinstance(configured, str) and configured.replace("torch.", "") in FLOAT_DTYPES[:3]:
            return configured.replace("torch.", "")
        counts: dict[str, int] = {}
        for shard in self.shards:
            for t in shard.tensors:
                if t.dtype in FLOAT_DTYPES:
                    counts[t.dtype] = counts.get(t.dtype, 0) + t.end - t.begin
        return max(counts, key=counts.__getitem__) if counts else "float32"

    @property
    def quantization(self) -> tuple[str, str]:
        quant = self.config.get("quantization_config")
        if not quant:
            return "none", ""
        text = json.dumps(quant, sort_keys=True).encode()
        return str(quant.get("quant_method", "unknown")), xxhash.xxh3_128_hexdigest(text)


def open_checkpoint(directory: str | os.PathLike[str], *, validate: bool = True) -> Checkpoint:
    """Find every shard and validate it; CheckpointError names the file and the problem.

    ``validate=False`` reads only the raw headers (what the cache key needs): an attach
    computes its key without parsing every tensor entry; anything that reads tensors
    (preload, write-through) parses and checks them on first use, and ``validate()``
    checks the whole checkpoint.
    """
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"model directory {root} does not exist or is not a directory")
    config_path = root / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        config = {}
    except ValueError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON: {exc}") from None
    ckpt = Checkpoint(root, tuple(_read_shard(root, name) for name in _shard_names(root)), config)
    if validate:
        ckpt.validate()
    return ckpt


def check_model_dir(directory: str | os.PathLike[str]) -> Path:
    """A directory a server can start from: its safetensors shards (by name) and ``config.json``. CheckpointError
    with preload's words otherwise, before anything starts (a folder of models, say, instead of one)."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"model directory {root} does not exist or is not a directory")
    _shard_names(root)
    return check_config_dir(root)


def check_config_dir(root: Path) -> Path:
    """A directory with a ``config.json`` (what any engine reads first); CheckpointError otherwise."""
    if not root.is_dir():
        raise CheckpointError(f"model directory {root} does not exist or is not a directory")
    if not (root / "config.json").is_file():
        raise CheckpointError(f"no config.json in {root}; a model directory holds it beside its weight files")
    return root


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def check_tokenizer_dir(root: str | os.PathLike[str]) -> Path:
    """A directory with a tokenizer an engine can load (one of ``TOKENIZER_FILES``, or a tiktoken file): without
    one a server starts, says it is ready, and answers every request with an error. CheckpointError otherwise."""
    root = Path(root)
    if any((root / name).is_file() for name in TOKENIZER_FILES) or any(root.glob("*.tiktoken")):
        return root
    raise CheckpointError(f"no tokenizer files in {root} ({', '.join(TOKENIZER_FILES)}): an engine would start but "
                          f"answer no request; put the model's tokenizer beside its weights")


def _shard_names(root: Path) -> list[str]:
    index = root / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index} has no valid weight_map: {exc}") from None
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that are missing: {missing}")
        return names
    names = sorted(p.name for p in root.glob("*.safetensors"))
    if not names:
        raise CheckpointError(f"no *.safetensors files in {root}; hotweights reads safetensors checkpoints only")
    if len(names) > 1:
        raise CheckpointError(f"{root} has {len(names)} safetensors files but no {INDEX_NAME}")
    return names


def _read_shard(root: Path, name: str) -> Shard:
    path = root / name
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: file of {st.st_size} bytes is too short for a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES or 8 + length > st.st_size:
            raise CheckpointError(f"{path}: header length {length} is beyond the file ({st.st_size} bytes); "
                                  f"the file is truncated or not safetensors")
        header_bytes = f.read(length)
    return Shard(path, name, st, bytes(header_bytes))


def _parse_tensors(shard: Shard) -> tuple[StoredTensor, ...]:
    path = shard.path
    try:
        header = json.loads(shard.header_bytes)
    except ValueError as exc:
        raise CheckpointError(f"{path}: header is not valid JSON ({exc}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    data_start = 8 + len(shard.header_bytes)
    tensors = []
    for tname, info in header.items():
        if tname == "__metadata__":
            continue
        tensors.append(_stored_tensor(path, tname, info, data_start, shard.stat.st_size))
    tensors.sort(key=lambda t: t.begin)
    return tuple(tensors)


def _stored_tensor(path: Path, name: str, info: Any, data_start: int, file_size: int) -> StoredTensor:
    # fast path first (every start of an engine parses every header); _bad_tensor says what is wrong
    if type(info) is dict:
        dtype, shape, offsets = ST_DTYPES.get(info.get("dtype")), info.get("shape"), info.get("data_offsets")
        if dtype is not None and type(shape) is list and type(offsets) is list and len(offsets) == 2:
            numel = 1
            for d in shape:
                if type(d) is not int or d < 0:
                    break
                numel *= d
            else:
                first, last = offsets
                if type(first) is int and type(last) is int:
                    begin, end = data_start + first, data_start + last
                    if data_start <= begin <= end <= file_size and end - begin == numel * DTYPE_ITEMSIZE[dtype]:
                        return StoredTensor(name, dtype, tuple(shape), begin, end)
    raise _bad_tensor(path, name, info, data_start, file_size)


def _bad_tensor(path: Path, name: str, info: Any, data_start: int, file_size: int) -> CheckpointError:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        return CheckpointError(f"{where}: entry is not an object")
    dtype = ST_DTYPES.get(info.get("dtype"))
    if dtype is None:
        return CheckpointError(f"{where}: unsupported dtype {info.get('dtype')!r}; supported: {sorted(ST_DTYPES)}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return CheckpointError(f"{where}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        return CheckpointError(f"{where}: bad data_offsets {offsets!r}")
    return CheckpointError(f"{where}: data_offsets {offsets} do not fit shape {shape} {dtype} in a file of "
                           f"{file_size} bytes; the file is truncated or corrupt")


class DeviceIdentity(Protocol):
    """What a key takes of a device: a ``pools.devices.Device`` (which imports torch), or a keeper row's device."""

    @property
    def kind(self) -> str: ...
    @property
    def uuid(self) -> str: ...


def checkpoint_key(ckpt: Checkpoint, *, dtype: str, device: DeviceIdentity | None = None,
                   digests: dict[str, str] | None = None, cache: DigestCache | None = None,
                   tp_size: int = 1, tp_rank: int = 0, pp_size: int = 1, pp_rank: int = 0,
                   layout: str = "checkpoint", rehash: bool = False) -> CacheKey:
    """The key of ``ckpt`` as loaded with ``dtype`` on ``device`` (the host when None).

    Shard content digests come from ``digests`` (name -> digest, fresh from a preload)
    or else from the digest cache by file identity; only a cache miss reads the file,
    unless ``rehash`` (read and hash every file now).
    """
    cache = cache or DigestCache()
    shards = []
    for shard in ckpt.shards:
        content = (digests or {}).get(shard.name) or cache.digest(shard.path, shard.stat, rehash=rehash)
        shards.append(ShardId(shard.name, shard.stat.st_size, xxhash.xxh3_128_hexdigest(shard.header_bytes),
                              content))
    quant, quant_digest = ckpt.quantization
    return CacheKey(
        shards=tuple(shards), arch=ckpt.arch, dtype=ckpt.resolve_dtype(dtype), quantization=quant,
        quantization_digest=quant_digest, revision=str(ckpt.config.get("_commit_hash") or ""), layout=layout,
        tp_size=tp_size, tp_rank=tp_rank, pp_size=pp_size, pp_rank=pp_rank,
        device_kind=device.kind if device else "cpu", device_id=device.uuid if device else "host",
        model=ckpt.directory.name,
    )


def target_dtype(stored: str, requested: str, quantized: bool) -> str:
    """Floating tensors take the requested dtype; integer, bool and quantized stay as stored."""
    if quantized or stored not in FLOAT_DTYPES:
        return stored
    return requested
