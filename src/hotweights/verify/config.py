"""What ``hotweights verify`` runs and what it records: its config (engine command templates
included), each check and each server run."""

from __future__ import annotations

from dataclasses import dataclass, field

ENGINE_CMDS = {
    "hotweights": "{python} -m hotweights serve {model} --port {port} --dtype {dtype} --device {device} "
                  "--load-format {load_format} --model-loader-extra-config {extra}",
    # what users run on every restart: the launcher (its strict preflight, the warm standby), vLLM behind it
    "vllm": "{vllm_python} -m hotweights vllm serve {model} --port {port} --dtype {dtype} "
            "--tensor-parallel-size {tp} --load-format {load_format} --model-loader-extra-config {extra} "
            "--enforce-eager",
}
PRELOAD_CMD = ("{python} -m hotweights preload --model {model} --dtype {dtype} --device {device} "
               "--tensor-parallel-size {tp} --json --socket-dir {socket_dir}")
# vLLM gets the engine layout, made by vLLM's own loader (a vLLM run that publishes, then stops)
VLLM_PRELOAD_CMD = ("{python} -m hotweights preload --engine vllm --model {model} --dtype {dtype} "
                    "--tensor-parallel-size {tp} --vllm-python {vllm_python} --vllm-arg=--enforce-eager "
                    "--json --socket-dir {socket_dir}")


@dataclass(frozen=True, slots=True)
class VerifyConfig:
    model: str
    engine: str = "hotweights"
    dtype: str = "auto"
    device: str = "cpu"
    tp_size: int = 1
    out: str = "hotweights-verify"
    prompt: str = "The weight cache"
    max_tokens: int = 16
    port: int = 8000
    timeout_s: float = 600.0
    interval_s: float = 0.25
    engine_cmd: str | None = None
    preload_cmd: str | None = None  # default: VLLM_PRELOAD_CMD for --engine vllm, else PRELOAD_CMD
    cold: bool = True  # a disk start with the checkpoint's pages evicted first, beside the page-cache-warm one

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_CMDS and self.engine_cmd is None:
            raise ValueError(f"engine must be one of {sorted(ENGINE_CMDS)} (or pass --engine-cmd)")
        if self.dtype not in ("auto", "float16", "bfloat16", "float32"):
            raise ValueError(f"dtype must be auto, float16, bfloat16 or float32, got {self.dtype!r}")

    @property
    def preload_template(self) -> str:
        if self.preload_cmd is not None:
            return self.preload_cmd
        return VLLM_PRELOAD_CMD if self.engine == "vllm" and self.engine_cmd is None else PRELOAD_CMD


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class Run:
    label: str
    ready: bool
    elapsed_s: float
    answer: str | None
    log_path: str
    evidence: list[str] = field(default_factory=list)
    exit_code: int | None = None
    phases: dict | None = None  # the server's startup line (hotweights engine), seconds per phase
    page_cache: float | None = None  # fraction of the checkpoint in the page cache at start
    weights_s: float | None = None  # the weights phase: the startup line's, or vLLM's "Model loading took"
