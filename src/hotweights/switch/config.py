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
    keep_standbys = false    # true: on the way out, leave the warm standbys (vLLM imported) for the next front
    schedule = "fair"        # which waiting model goes next: "fair" (most requests waiting; one waiting over
    starve_after_s = 10      # starve_after_s goes first), "fifo" (first come), or "deadline" (the earliest due:
    slo_ttft_s = 2           # a first token slo_ttft_s after its request came, a held stream's next token
    slo_token_s = 0.1        # slo_token_s a token after its first; turns end by those, never shorter than a wake;
    first_token_s = 0.4      # its model awake first_token_s before a first token is due: its prefill, the relay)
    turn_s = 1               # where memory forces a choice between busy engines: a busy one leaves (takes no new
                             # request, parks once its requests end) once the requests waiting for another model
                             # have waited turn_s seconds in sum per request in flight on it
    preempt = false          # true: a busy engine that leaves pauses its streamed requests at once, and each
                             # continues on its next wake, seamless in the client's stream (preempt.py)
    keep_kv = true           # with preempt, a park that can keep them (where the wake fits beside) holds the
                             # paused requests with their KV caches: they go on at its wake, nothing computed
                             # again; false: each continues by a new request from its token ids (its prompt again)
    held_kv = "gpu"          # "host": a held park moves its KV cache to pinned host memory (vLLM), so it keeps
                             # on the GPU only what a park without streams does; its wake copies it back
    tiers = "fixed"          # "traffic": as many models as parked_weights = "gpu" names hold the GPU tier, the
    tier_window_s = 300      # busiest over the last tier_window_s (tiers.py), moved where the gain beats a copy
    log_dir = ""             # each engine's log goes here ("": a new temporary directory per run, the oldest
                             # of those removed past the ten newest, once a week has passed over them)
    preload_jobs = 0         # start-up's preloads at once, ahead of the starts, where GPU memory allows (a vLLM
                             # preload is a whole vLLM start); 0: 4 where there are GPUs, else 1 (in each start)
    start_jobs = 0           # start-up's engine starts at once where no start profiles the GPU's memory (vLLM
                             # with --kv-cache-memory-bytes) and GPU memory holds them; 0: 4 where there are GPUs
    compile_ahead = false    # true: the first start's compile runs beside its preload (vLLM, dummy weights), where
                             # that preload runs (startup.py); off by default: it wins only where the preload
                             # outlasts a start without a standby (docs/switch.md)
    read_ahead = true        # start-up reads the next preloads' checkpoints into the page cache (readahead.py)

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
    ready_nodes = 2          # in a cluster (hotweights cluster, cluster/config.py): how many nodes keep it ready
                             # ("all": every one); one front ignores it, as it ignores the [cluster] table
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import ConfigDict, Field, Strict, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass

from .. import argv
from ..errors import CheckpointError
from ..loading.checkpoint import check_config_dir, check_model_dir, check_tokenizer_dir
from .gpus import gpu_memory
from .kinds import KINDS

NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
NAME_RE = re.compile(NAME)
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
GONE_KEYS = {"overlap_after_s": "a wake goes beside a busy engine at once where memory allows; turn_s bounds a busy "
                                "engine's turn where it does not"}
TOKENIZER = argv.Option(("--tokenizer",))


class ConfigError(ValueError):
    """What is wrong with the configuration, and where."""


# One schema: each key's type and bounds are its field's, and ``description`` is what an error says it must be.
# Strict (a TOML string is not a number, nor true a port), except where TOML's list stands for a tuple.
_SCHEMA = ConfigDict(extra="forbid", strict=True)
_LIST = Strict(False)
Schedule = Literal["fair", "fifo", "deadline"]
ParkedWeights = Literal["gpu", "host"]
Start = Literal["eager", "cached", "lazy"]
Seconds = Annotated[float, Field(ge=0, description="0 (never) or more seconds")]
Name = Annotated[str, Field(pattern=NAME, description="letters, digits and ._:/- (up to 128)")]


@dataclass(frozen=True, config=_SCHEMA)
class ModelConfig:
    """A ``[[model]]`` table."""

    name: Name
    checkpoint: Annotated[Path, Strict(False)]
    engine: str = "hotweights"
    args: Annotated[tuple[str, ...], _LIST, Field(description="a list of strings")] = ()
    default: bool = False
    keep_awake: bool = False
    park_level: Literal[1, 2] = 1
    deep_park_after_s: Seconds = 0.0
    parked_weights: ParkedWeights = "gpu"
    gpus: Annotated[tuple[Annotated[int, Field(ge=0)], ...], _LIST,
                    Field(description="distinct GPU indices (0, 1, ...)")] = ()  # () : every GPU the front sees
    # more names requests may ask for it by (routed, listed in /v1/models)
    aliases: Annotated[tuple[str, ...], _LIST,
                       Field(description="names of letters, digits and ._:/- (up to 128)")] = ()
    start: Start = "eager"  # "eager": started at start-up; "cached": preloaded then, started by its first request;
    #                       "lazy": nothing until its first request (its preload then, and its start)
    park_after_s: Seconds = 0.0  # idle this long, an awake engine parks (0: while memory allows, it stays awake)
    stop_after_s: Seconds = 0.0  # idle this long, its engine stops: its host memory and GPU residue freed too
    # a cluster's (hotweights.cluster): the nodes that keep it ready; None: [cluster] ready_nodes. One front ignores it
    ready_nodes: Annotated[Annotated[int, Field(ge=1)] | Literal["all"] | None,
                           Field(description='"all" or at least 1')] = None

    @field_validator("engine")
    @classmethod
    def _known(cls, engine: str) -> str:
        if engine not in KINDS:
            raise ValueError(f"engine must be one of {', '.join(KINDS)}, got {engine!r}")
        return engine

    @field_validator("args")
    @classmethod
    def _not_the_fronts(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        for flags, instead in FRONT_FLAGS.items():
            if argv.Option(flags).present(args):
                raise ValueError(f"args: {'/'.join(flags)} is the front's to set ({instead})")
        return args

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, gpus: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(gpus)) < len(gpus):
            raise ValueError(f"gpus must be distinct GPU indices (0, 1, ...), got {list(gpus)}")
        return gpus

    @field_validator("aliases")
    @classmethod
    def _names(cls, aliases: tuple[str, ...]) -> tuple[str, ...]:
        if not all(NAME_RE.match(a) for a in aliases):
            raise ValueError(f"aliases must be names of letters, digits and ._:/- (up to 128), got {list(aliases)}")
        return aliases

    @model_validator(mode="after")
    def _enough_gpus(self) -> ModelConfig:
        try:
            tp = KINDS[self.engine].ranks_of(self.args)
        except ValueError as exc:
            raise ValueError(f"args: {exc}") from None
        if self.gpus and len(self.gpus) < tp:
            raise ValueError(f"gpus lists {len(self.gpus)} GPU(s) but --tensor-parallel-size {tp} needs {tp}")
        return self

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


def _api_key() -> str:
    return os.environ.get("VLLM_API_KEY", "")


@dataclass(frozen=True, config=_SCHEMA)
class SwitchConfig:
    """The ``[switch]`` table and the models."""

    models: tuple[ModelConfig, ...]
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535, description="1-65535")] = 8000
    # "auto": GPU memory bounds the awake set; N: at most N awake per GPU
    max_awake: Annotated[Annotated[int, Field(ge=1)] | Literal["auto"],
                         Field(description='"auto" or at least 1')] = "auto"
    request_timeout_s: Annotated[float, Field(gt=0, description="positive (seconds a request may wait for its "
                                                                 "model)")] = 300.0
    api_key: str = dataclasses.field(default_factory=_api_key)
    socket_dir: str = ""
    parking: bool = True
    stop_keeper: bool = False  # on the way out, stop the keeper if this front's preloads started it
    keep_standbys: bool = False  # on the way out, leave the engines' warm standbys running (else retired)
    schedule: Schedule = "fair"  # or "fifo", "deadline": which waiting model a switch serves next (schedule.py)
    # deadline: a request's first token is due slo_ttft_s after it came, a held stream's next token slo_token_s a
    # token after its first (Aegaeon's token deadline)
    slo_ttft_s: Annotated[float, Field(gt=0, description="positive (seconds)")] = 2.0
    slo_token_s: Annotated[float, Field(gt=0, description="positive (seconds)")] = 0.1
    # deadline: a model is due awake first_token_s before its request's first token (its prefill, the relay)
    first_token_s: Annotated[float, Field(ge=0, description="0 or more (seconds)")] = 0.4
    starve_after_s: Seconds = 10.0  # fair: a model whose request has waited this long goes next
    # a busy engine's turn, in request-seconds waited per request it has in flight (schedule.py)
    turn_s: Annotated[float, Field(ge=0, description="0 or more")] = 1.0
    preempt: bool = False  # a leaving engine pauses its streamed requests; each continues on its next wake
    keep_kv: bool = True  # with preempt: held in the engine with their KV caches where its park can (serve/park.py)
    held_kv: Literal["gpu", "host"] = "gpu"  # host: a held vLLM park moves its KV cache to pinned host memory
    tiers: Literal["fixed", "traffic"] = "fixed"  # traffic: the busiest models hold the GPU tier (tiers.py)
    tier_window_s: Annotated[float, Field(gt=0, description="positive (seconds)")] = 300.0
    # start-up's preloads at once (startup.py); 0: auto (with_auto_jobs())
    preload_jobs: Annotated[int, Field(ge=0, description="0 (auto) or more")] = 0
    # start-up's starts at once where none profiles the GPU's memory (schedule.startup_batch); 0: auto
    start_jobs: Annotated[int, Field(ge=0, description="0 (auto) or more")] = 0
    compile_ahead: bool = False  # the first start's compile beside its preload (startup.begin_compile_ahead)
    read_ahead: bool = True  # the next preloads' checkpoints read into the page cache ahead of them (readahead.py)
    log_dir: str = ""  # each engine's log (and its preload's) go here; "": a new temporary directory per run

    @model_validator(mode="after")
    def _one_default_named_once(self) -> SwitchConfig:
        if not self.models:
            raise ValueError("no model ([[model]] tables, or --model NAME=DIR)")
        names = [n for m in self.models for n in (m.name, *m.aliases)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"model names and aliases must differ: {', '.join(twice)} is named twice")
        if sum(m.default for m in self.models) > 1:
            raise ValueError("more than one model is the default")
        if self.default.start != "eager":
            raise ValueError(f"the default model ({self.default.name}) starts eagerly, as /health waits for it: "
                             f"drop its start = {self.default.start!r}, or make another model the default")
        return self

    @property
    def awake_cap(self) -> int:
        """``max_awake`` as a number: 0 where it is "auto" (no cap but memory)."""
        return 0 if self.max_awake == "auto" else self.max_awake

    def with_auto_jobs(self) -> SwitchConfig:
        """This configuration with its automatic job counts set (``nvidia-smi`` read once): start-up's preloads and
        starts at once, ``preload_jobs`` and ``start_jobs``, else 4 each where there are GPUs (their memory admits
        each), else 1: each preload in its start, one start at a time, as the CPU's cores are the engines' too."""
        auto = min(4, len(self.models)) if gpu_memory() else 1
        return dataclasses.replace(self, preload_jobs=self.preload_jobs or auto, start_jobs=self.start_jobs or auto)

    @property
    def default(self) -> ModelConfig:
        return next((m for m in self.models if m.default), self.models[0])


SWITCH_KEYS = tuple(f.name for f in dataclasses.fields(SwitchConfig) if f.name != "models")
_TYPES = {"int_type": "a whole number", "float_type": "a number", "bool_type": "true or false",
          "string_type": "a string", "tuple_type": "a list", "path_type": "a path"}
T = TypeVar("T")


def _checked(make: Callable[[], T], where: str, fields: tuple[str, ...]) -> T:
    """What ``make`` builds, or ConfigError: its first error in one line, naming the key."""
    try:
        return make()
    except ValidationError as exc:  # an unknown key first: a typo of a required one is said as the typo
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "unexpected_keyword_argument")
        raise ConfigError(f"{where}: {_said(errors[0], fields)}") from None


def _said(error: Any, fields: tuple[str, ...]) -> str:
    """One of pydantic's errors as this file's one line: the key, what it must be, what it got."""
    loc = [part for part in error["loc"] if isinstance(part, str)]
    key = loc[0] if loc else ""
    if error["type"] in ("value_error", "assertion_error"):
        return str(error["ctx"]["error"])
    if error["type"] == "unexpected_keyword_argument":
        if key in GONE_KEYS:
            return f"{key} is gone ({GONE_KEYS[key]})"
        return f"unknown key {key!r} (known: {', '.join(fields)})"
    if error["type"] == "missing":
        return f"{key} is required"
    if error["type"] == "literal_error":  # 'a', 'b' or 'c'
        values = error["ctx"]["expected"].replace("'", "").replace(" or ", ", ").split(", ")
        one = " or ".join(values) if len(values) < 3 else "one of " + ", ".join(values)
        return f"{key} must be {one}, got {error['input']!r}"
    kind, bounds = _TYPES.get(error["type"]), _DESCRIBED.get(key)
    if error["type"] in ("int_type", "float_type") and bounds and len(error["loc"]) == 1:  # not a number: say so
        # ('port = "8469"': a number, not a string); a union's branches say their own
        return f"{key} must be {kind} ({bounds}), got {error['input']!r}"
    must = bounds or kind or error["msg"].removeprefix("Input should be ").lower()
    return f"{key} must be {must}, got {error['input']!r}"


def _described(*schemas: Any) -> dict[str, str]:
    return {name: f.description for schema in schemas for name, f in schema.__pydantic_fields__.items()
            if f.description}


_DESCRIBED = _described(ModelConfig, SwitchConfig)


def model(table: dict[str, Any], where: str) -> ModelConfig:
    """A ``[[model]]`` table checked, its checkpoint included (its files, its tokenizer), and its GPUs against those
    the front sees; ConfigError naming the key that is wrong."""
    made = _checked(lambda: ModelConfig(**table), where, _MODEL_KEYS)
    own_format = KINDS[made.engine].reads_checkpoint_itself(made.args)
    made = dataclasses.replace(made, checkpoint=made.checkpoint.expanduser())
    try:  # vLLM reading the checkpoint itself may read other formats than safetensors
        check_model_dir(made.checkpoint) if not own_format else check_config_dir(made.checkpoint)
        if not TOKENIZER.present(made.args):  # vLLM's --tokenizer: another directory's
            check_tokenizer_dir(made.checkpoint)
    except CheckpointError as exc:
        raise ConfigError(f"{where}: checkpoint: {exc}") from None
    made.cuda_visible_devices()  # a GPU the front does not see is an error now, not at its first start
    return made


_MODEL_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig))


def build(switch: dict[str, Any], models: list[ModelConfig], where: str) -> SwitchConfig:
    """The ``[switch]`` table with its models; ConfigError naming the key that is wrong."""
    return _checked(lambda: SwitchConfig(tuple(models), **switch), where, SWITCH_KEYS)


def overlay(config: SwitchConfig, given: dict[str, Any], where: str) -> SwitchConfig:
    """``config`` with the command line's settings (``None``: not given) over the file's, checked again."""
    return _checked(lambda: dataclasses.replace(config, **{k: v for k, v in given.items() if v is not None}), where,
                    SWITCH_KEYS)


def args_checked(config: SwitchConfig) -> SwitchConfig:
    """``config``, once each engine kind's own parser has taken every model's ``args`` (vLLM's: a typo such as
    ``--max-modl-len`` failed only at the engine's start); ConfigError naming the first model refused, in one line.
    Not in ``load``: vLLM's parser takes seconds to import, and ``switch status`` reads the file too."""
    kinds = {m.engine for m in config.models}
    said = {name: line for kind in sorted(kinds)
            for name, line in KINDS[kind].refused([m for m in config.models if m.engine == kind]).items()}
    for m in config.models:
        if m.name in said:
            raise ConfigError(f"model {m.name}: {said[m.name]}")
    return config


def load(path: str | Path) -> SwitchConfig:
    """The configuration in the TOML file ``path``; ConfigError naming the table and key that is wrong."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    unknown = set(data) - {"switch", "model", "cluster"}  # [cluster]: hotweights cluster's (cluster/config.py)
    if unknown:
        raise ConfigError(f"{path}: unknown table {sorted(unknown)[0]!r} (known: [switch], [[model]], [cluster])")
    tables = data.get("model", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: models are [[model]] tables (an array), not one [model] table")
    models = [model(t, f"{path} [[model]] #{i + 1}") for i, t in enumerate(tables)]
    return build(data.get("switch", {}), models, f"{path} [switch]")


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
