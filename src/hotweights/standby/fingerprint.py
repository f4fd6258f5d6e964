"""What a standby must share with a start to take it: a value with field diffs.

The interpreter (path and version), each package the engine names (version, location, newest file
mtime: a reinstall rewrites the files; hotweights, small and often an editable checkout: every file),
and every environment variable that changes what the engine imports or how (by prefix). A refusal
names the fields that differ, as a cache key's mismatch does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..key import FieldDiff

# what changes an engine's imports or its start, whatever the engine
ENV_PREFIXES = ("CUDA_", "NCCL_", "NVIDIA_", "TORCH", "PYTORCH_", "PYTHON", "LD_", "HF_", "TRANSFORMERS_",
                "TOKENIZERS_", "OMP_", "MKL_", "TRITON_", "HOTWEIGHTS_")
# turn standbys off, say when the next one imports, or how many are kept: no effect on what one imported
IGNORED = ("HOTWEIGHTS_VLLM_STANDBY", "HOTWEIGHTS_STANDBY_IMPORT", "HOTWEIGHTS_STANDBYS")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    fields: tuple[tuple[str, str], ...]  # sorted (name, value): "python", "package NAME", "env VAR"

    @classmethod
    def of(cls, packages: tuple[str, ...], env_prefixes: tuple[str, ...],
           environ: dict[str, str] | None = None, ignored: tuple[str, ...] = ()) -> Fingerprint:
        env = os.environ if environ is None else environ
        out = {"python": f"{os.path.realpath(sys.executable)} {sys.version.split()[0]}"}
        for name in packages:
            out[f"package {name}"] = package_stamp(name)
        for key in env:
            if key.startswith(ENV_PREFIXES + env_prefixes) and key not in IGNORED + ignored:
                out[f"env {key}"] = env[key]
        return cls(tuple(sorted(out.items())))

    def to_wire(self) -> dict[str, str]:
        return dict(self.fields)

    @classmethod
    def from_wire(cls, wire: dict[str, str]) -> Fingerprint:
        return cls(tuple(sorted((str(k), str(v)) for k, v in wire.items())))

    def diff(self, standby: Fingerprint) -> list[FieldDiff]:
        """Each field where ``standby`` (cached) differs from this start (requested); "(unset)" for absent."""
        mine, theirs = dict(self.fields), dict(standby.fields)
        return [FieldDiff(k, theirs.get(k, "(unset)"), mine.get(k, "(unset)"))
                for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]


def package_stamp(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    files = root.rglob("*.py") if name == "hotweights" else (root / "__init__.py", root)
    newest = max((p.stat().st_mtime_ns for p in files if p.exists()), default=0)
    return f"{version} {root} {newest}"
