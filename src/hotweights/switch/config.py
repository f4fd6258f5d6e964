"""``hotweights switch``'s configuration: a TOML file, or the quick form of the command line.

    [switch]                 # all optional
    host = "127.0.0.1"       # the one port a user exposes: loopback unless asked
    port = 8000
    max_awake = "auto"       # engines awake at once: "auto" (as many as GPU memory holds), or a cap per GPU
    request_timeout_s = 300  # how long a request may wait for its model, then 503
    api_key = ""             # like vllm serve --api-key (else $VLLM_API_KEY): Bearer on /v1/*
    socket_dir = ""          # the keeper's (default: hotweights' default)
    parking = true           # false: a switch stops the engine and starts the next one (llama-swap's way)
    stop_keeper = false      # true: on the way out, stop the keeper if this front started it (frees the weights)
    schedule = "fair"        # which waiting model goes next: "fair" (most requests waiting; one waiting over
    starve_after_s = 10      # starve_after_s goes first) or "fifo" (first come)
    turn_s = 1               # where memory forces a choice between busy engines: a busy one leaves (takes no new
                             # request, parks once its requests end) once the requests waiting for another model
                             # have waited turn_s seconds in sum per request in flight on it
    log_dir = ""             # each engine's log goes here ("": a new temporary directory per run, the oldest
                             # of those removed past the ten newest, once a week has passed over them)
    preload_jobs = 0         # start-up's preloads at once, ahead of the starts, where GPU memory allows (a vLLM
                             # preload is a whole vLLM start); 0: 4 where there are GPUs, else 1 (in each start)

    [[model]]
    name = "chat"            # the API's model name
    checkpoint = "/models/chat"
    engine = "hotweights"    # or "vllm" (hotweights vllm serve, from the standby)
    args = ["--max-model-len", "512"]   # the engine's own arguments
    default = true           # started awake (else the first model)
    keep_awake = false       # never parked for another model
    park_level = 1           # 1: weights kept mapped, 2: unmapped (a wake maps them again)
    deep_park_after_s = 0    # embedded engine: a level-1 park deepens to 2 after this idle time (0: never)
    parked_weights = "gpu"   # "host": a parked engine's weights leave the GPU (deep park; the keeper keeps a
                             # host copy, made once at start-up) and its wake uploads them: many models per GPU
    aliases = ["mini"]       # more names it answers to (its engine is asked for it by its name)
    start = "eager"          # started at start-up; "cached": preloaded then, started by its first request;
                             # "lazy": nothing until its first request (the default model is eager)
    park_after_s = 0         # idle this long, its awake engine parks (0: awake while memory allows)
    stop_after_s = 0         # idle this long, its engine stops, freeing its host memory too (0: never)
    gpus = [0]               # the GPUs it runs on (CUDA_VISIBLE_DEVICES of its preload and engine; as many as
                             # its --tensor-parallel-size); unset: those the front sees. max_awake counts per
                             # GPU: engines on GPUs of their own stay awake beside each other
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from .. import argv
from ..errors import CheckpointError
from ..loading.checkpoint import check_config_dir, check_model_dir, check_tokenizer_dir
from .gpus import gpu_memory
from .kinds import KINDS

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
# the engine flags the front sets itself (a model's own would make its engine unreachable, or its name unknown), and
# the config key that does what a user wanted of it
FRONT_FLAGS = {
    ("--served-model-name",): "the engine serves the model's name: set name, or aliases = [...] for more",
    ("--host", "--port", "--uds"): "the front gives each engine a loopback port of its own; the public address is "
                                   "[switch] host and port",
    ("--api-key",): "the front checks keys, and its engines answer only it: set [switch] api_key",
    ("--ssl-keyfile", "--ssl-certfile"): "the front talks plain HTTP to its engines on loopback; put TLS in front of "
                                         "the front",
}
TOKENIZER = argv.Option(("--tokenizer",))


class ConfigError(ValueError):
    """What is wrong with the configuration, and where."""


Schedule = Literal["fair", "fifo"]
ParkedWeights = Literal["gpu", "host"]
Start = Literal["eager", "cached", "lazy"]


@dataclass(frozen=True)
class ModelConfig:
    name: str
    checkpoint: Path
    engine: str = "hotweights"
    args: tuple[str, ...] = ()
    default: bool = False
    keep_awake: bool = False
    park_level: int = 1
    deep_park_after_s: float = 0.0
    parked_weights: ParkedWeights = "gpu"
    gpus: tuple[int, ...] = ()  # () : every GPU the front sees
    aliases: tuple[str, ...] = ()  # more names requests may ask for it by (routed, listed in /v1/models)
    start: Start = "eager"  # "eager": started at start-up; "cached": preloaded then, started by its first request;
    #                       "lazy": nothing until its first request (its preload then, and its start)
    park_after_s: float = 0.0  # idle this long, an awake engine parks (0: while memory allows, it stays awake)
    stop_after_s: float = 0.0  # idle this long, its engine stops: its host memory and GPU residue freed too (0: never)

    def cuda_visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES`` for its processes: ``gpus`` are indices among the GPUs the front sees (those of
        its own ``CUDA_VISIBLE_DEVICES``, when set); ConfigError for one it does not see."""
        front = os.environ.get("CUDA_VISIBLE_DEVICES")
        if front is None:
            return ",".join(str(g) for g in self.gpus)
        seen = [x.strip() for x in front.split(",") if x.strip()]
        if any(g >= len(seen) for g in self.gpus):
            raise ConfigError(f"model {self.name}: gpus {list(self.gpus)}, but the front sees {len(seen)} GPU(s) "
                              f"(CUDA_VISIBLE_DEVICES={front})")
        return ",".join(seen[g] for g in self.gpus)

    def shares_a_gpu(self, other: ModelConfig) -> bool:
        """Whether the two can contend for GPU memory (a model without ``gpus`` may use any)."""
        return not self.gpus or not other.gpus or bool(set(self.gpus) & set(other.gpus))

    @property
    def level(self) -> int:
        """The level it parks at: weights kept in host memory while parked need the deep park."""
        return 2 if self.parked_weights == "host" else self.park_level


@dataclass(frozen=True)
class SwitchConfig:
    models: tuple[ModelConfig, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    max_awake: int = 0  # 0: auto (GPU memory bounds the awake set); N: at most N awake per GPU
    request_timeout_s: float = 300.0
    api_key: str = ""
    socket_dir: str = ""
    parking: bool = True
    stop_keeper: bool = False  # on the way out, stop the keeper if this front's preloads started it
    schedule: Schedule = "fair"  # or "fifo": which waiting model a switch serves next (switcher.py)
    starve_after_s: float = 10.0  # fair: a model whose request has waited this long goes next
    turn_s: float = 1.0  # a busy engine's turn, in request-seconds waited per request it has in flight (schedule.py)
    preload_jobs: int = 0  # start-up's preloads at once (preloads.py); 0: auto (jobs())
    log_dir: str = ""  # each engine's log (and its preload's) go here; "": a new temporary directory per run

    def jobs(self) -> int:
        """Start-up's preloads at once: ``preload_jobs``, else 4 where there are GPUs (their memory admits each),
        else 1: each in its start, as the CPU's cores are the engines' too."""
        return self.preload_jobs or (min(4, len(self.models)) if gpu_memory() else 1)

    @property
    def default(self) -> ModelConfig:
        return next((m for m in self.models if m.default), self.models[0])


SWITCH_KEYS = {"host": str, "port": int, "max_awake": (int, str), "request_timeout_s": (int, float), "api_key": str,
               "socket_dir": str, "parking": bool, "stop_keeper": bool, "schedule": str,
               "starve_after_s": (int, float), "turn_s": (int, float), "preload_jobs": int, "log_dir": str}
GONE_KEYS = {"overlap_after_s": "a wake goes beside a busy engine at once where memory allows; turn_s bounds a busy "
                                "engine's turn where it does not"}
_MODEL_KEYS = {"name": str, "checkpoint": str, "engine": str, "args": list, "default": bool, "keep_awake": bool,
               "park_level": int, "deep_park_after_s": (int, float), "parked_weights": str, "gpus": list,
               "aliases": list, "park_after_s": (int, float), "stop_after_s": (int, float), "start": str}
STARTS = get_args(Start)


def _typed(table: dict[str, Any], keys: dict[str, Any], where: str) -> dict[str, Any]:
    for key, value in table.items():
        if key in GONE_KEYS:
            raise ConfigError(f"{where}: {key} is gone ({GONE_KEYS[key]})")
        if key not in keys:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(keys)})")
        if not isinstance(value, keys[key]) or (isinstance(value, bool) and keys[key] is not bool):
            raise ConfigError(f"{where}: {key} must be {getattr(keys[key], '__name__', 'a number')}, "
                              f"got {value!r}")
    return table


def model(table: dict[str, Any], where: str) -> ModelConfig:  # noqa: C901, PLR0912
    _typed(table, _MODEL_KEYS, where)
    for key in ("name", "checkpoint"):
        if key not in table:
            raise ConfigError(f"{where}: {key} is required")
    if not NAME_RE.match(table["name"]):
        raise ConfigError(f"{where}: name {table['name']!r} must be letters, digits and ._:/- (up to 128)")
    if table.get("engine", "hotweights") not in KINDS:
        raise ConfigError(f"{where}: engine must be one of {', '.join(KINDS)}, got {table['engine']!r}")
    kind = KINDS[table.get("engine", "hotweights")]
    if table.get("park_level", 1) not in (1, 2):
        raise ConfigError(f"{where}: park_level must be 1 or 2, got {table['park_level']!r}")
    if table.get("parked_weights", "gpu") not in ("gpu", "host"):
        raise ConfigError(f"{where}: parked_weights must be gpu or host, got {table['parked_weights']!r}")
    if not all(isinstance(a, str) for a in table.get("args", [])):
        raise ConfigError(f"{where}: args must be a list of strings")
    for flags, instead in FRONT_FLAGS.items():
        if argv.Option(flags).present(table.get("args", [])):
            raise ConfigError(f"{where}: args: {'/'.join(flags)} is the front's to set ({instead})")
    if table.get("start", "eager") not in STARTS:
        raise ConfigError(f"{where}: start must be one of {', '.join(STARTS)}, got {table['start']!r}")
    for key in ("park_after_s", "stop_after_s"):
        if table.get(key, 0) < 0:
            raise ConfigError(f"{where}: {key} must be 0 (never) or more seconds, got {table[key]!r}")
    aliases = table.get("aliases", [])
    if not all(isinstance(a, str) and NAME_RE.match(a) for a in aliases):
        raise ConfigError(f"{where}: aliases must be names of letters, digits and ._:/- (up to 128), got {aliases!r}")
    gpus = table.get("gpus", [])
    if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus) or len(set(gpus)) < len(gpus):
        raise ConfigError(f"{where}: gpus must be distinct GPU indices (0, 1, ...), got {gpus!r}")
    args = list(table.get("args", []))
    try:
        tp = kind.ranks_of(args)
    except ValueError as exc:
        raise ConfigError(f"{where}: args: {exc}") from None
    if gpus and len(gpus) < tp:
        raise ConfigError(f"{where}: gpus lists {len(gpus)} GPU(s) but --tensor-parallel-size {tp} needs {tp}")
    checkpoint = Path(table["checkpoint"]).expanduser()
    own_format = kind.reads_checkpoint_itself(args)
    try:  # vLLM reading the checkpoint itself may read other formats than safetensors
        check_model_dir(checkpoint) if not own_format else check_config_dir(checkpoint)
        if not TOKENIZER.present(args):  # vLLM's --tokenizer: another directory's
            check_tokenizer_dir(checkpoint)
    except CheckpointError as exc:
        raise ConfigError(f"{where}: checkpoint: {exc}") from None
    made = ModelConfig(table["name"], checkpoint, table.get("engine", "hotweights"), tuple(args),
                       table.get("default", False), table.get("keep_awake", False), table.get("park_level", 1),
                       float(table.get("deep_park_after_s", 0)), table.get("parked_weights", "gpu"), tuple(gpus),
                       tuple(aliases), table.get("start", "eager"), float(table.get("park_after_s", 0)),
                       float(table.get("stop_after_s", 0)))
    made.cuda_visible_devices()  # a GPU the front does not see is an error now, not at its first start
    return made


def build(switch: dict[str, Any], models: list[ModelConfig], where: str) -> SwitchConfig:  # noqa: C901
    _typed(switch, SWITCH_KEYS, f"{where} [switch]")
    if not models:
        raise ConfigError(f"{where}: no model ([[model]] tables, or --model NAME=DIR)")
    names = [n for m in models for n in (m.name, *m.aliases)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: model names and aliases must differ: {', '.join(twice)} is named twice")
    if sum(m.default for m in models) > 1:
        raise ConfigError(f"{where}: more than one model is the default")
    default = next((m for m in models if m.default), models[0])
    if default.start != "eager":
        raise ConfigError(f"{where}: the default model ({default.name}) starts eagerly, as /health waits for it: "
                          f"drop its start = {default.start!r}, or make another model the default")
    awake = switch.get("max_awake", "auto")
    if awake == "auto":
        switch = {**switch, "max_awake": 0}
    elif isinstance(awake, str) or awake < 1:
        raise ConfigError(f"{where}: max_awake must be \"auto\" or at least 1, got {awake!r}")
    if switch.get("schedule", "fair") not in ("fair", "fifo"):
        raise ConfigError(f"{where}: schedule must be fair or fifo, got {switch['schedule']!r}")
    if switch.get("request_timeout_s", 300) <= 0:
        raise ConfigError(f"{where}: request_timeout_s must be positive (seconds a request may wait for its "
                          f"model), got {switch['request_timeout_s']!r}")
    if switch.get("turn_s", 1.0) < 0:
        raise ConfigError(f"{where}: turn_s must be 0 or more, got {switch['turn_s']!r}")
    if switch.get("preload_jobs", 0) < 0:
        raise ConfigError(f"{where}: preload_jobs must be 0 (auto) or more, got {switch['preload_jobs']!r}")
    if not 0 < switch.get("port", 8000) < 65536:
        raise ConfigError(f"{where}: port must be 1-65535")
    values = {k: switch[k] for k in SWITCH_KEYS if k in switch}
    values.setdefault("api_key", os.environ.get("VLLM_API_KEY", ""))
    return SwitchConfig(tuple(models), **values)


def load(path: str | Path) -> SwitchConfig:
    """The configuration in the TOML file ``path``; ConfigError naming the table and key that is wrong."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    unknown = set(data) - {"switch", "model"}
    if unknown:
        raise ConfigError(f"{path}: unknown table {sorted(unknown)[0]!r} (known: [switch], [[model]])")
    tables = data.get("model", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: models are [[model]] tables (an array), not one [model] table")
    models = [model(t, f"{path} [[model]] #{i + 1}") for i, t in enumerate(tables)]
    return build(data.get("switch", {}), models, str(path))


def quick(pairs: list[str], engine: str, args: list[str], switch: dict[str, Any],
          parked_weights: ParkedWeights = "gpu") -> SwitchConfig:
    """``--model NAME=DIR ...`` with one engine, its arguments and ``parked_weights`` for all; the first is the
    default."""
    models = []
    for i, pair in enumerate(pairs):
        name, sep, directory = pair.partition("=")
        if not sep or not name or not directory:
            raise ConfigError(f"--model takes NAME=DIR, got {pair!r}")
        models.append(model({"name": name, "checkpoint": directory, "engine": engine, "args": list(args),
                             "parked_weights": parked_weights}, f"--model #{i + 1} ({name})"))
    return build({k: v for k, v in switch.items() if v is not None}, models, "the command line")
