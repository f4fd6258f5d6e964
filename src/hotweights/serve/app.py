"""``hotweights serve``: an OpenAI-compatible server whose weights come through the cache.

Startup loads the tokenizer, builds the model on the meta device, attaches the weights
(or loads them from disk, by the fallback policy), runs one forward pass, and only then
starts serving: ``/health`` answers 200 only when the model can answer. One line then
gives every phase from process start (``startup: imports=... tokenizer=... cuda_context=...
model_build=... (engine=native|transformers) weights=... (source=...) warmup=... listening=... ready=...``).
The phases add up to ``ready``: they run one after another on the main thread; a side
thread imports the HTTP stack (``web.py``) beside the warm-up, and waiting for the rest of
that import counts as ``listening``.
The model is ``engines.native.Decoder`` where it covers the architecture, so serving
imports nothing of transformers (``--model-impl``).

Not covered: batching, prompt logprobs, tools, structured output, authentication (binds 127.0.0.1).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import evidence
from ..parked.records import take_port
from ..unix import proc_stat
from .config import ServeConfig
from .generate import Generator
from .tokenizer import read_json

logger = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 3.0  # after a signal, how long open connections may take to finish before they are cut


def process_age_s() -> float:
    """Seconds since this process started (the kernel's start time, so interpreter start-up counts)."""
    fields = proc_stat("self")
    assert fields is not None, "/proc/self/stat: this process exists"
    start_ticks = int(fields[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True, slots=True)
class Started:
    phases: dict[str, float]  # seconds of each phase, imports counted from process start
    engine: str  # "native" | "transformers"
    source: str  # where the weights came from


def load(config: ServeConfig, overlap=None) -> tuple[Generator, Started]:
    """Imports, tokenizer, CUDA context, model, weights, warm-up; returns the generator and
    each phase's seconds, measured from process start (``imports`` holds the interpreter too).

    ``overlap()`` is called once the weights are in: work it starts on another thread runs
    beside the warm-up. Started earlier, it shares the GIL with the model phases and makes
    both the weights phase and the whole start slower (``benchmarks/startup_gc.py``).
    """
    import torch

    from ..engines.transformers import load_model
    from .tokenizer import Tokenizer

    # torch's import leaves objects that every full collection of the start-up would walk again,
    # holding the GIL the side thread and the model phases share (benchmarks/startup_gc.py); they
    # live as long as the server, so they leave the collector's generations (vLLM: freeze_gc_heap)
    gc.freeze()
    t_imports = process_age_s()
    t0 = time.perf_counter()
    tokenizer = Tokenizer(config.model)
    t1 = time.perf_counter()
    if config.device.startswith("cuda"):
        # CUDA set-up, on its own clock: the context, the driver bindings the pools use, the GPU's UUID
        # (what a bare attach benchmark has done before its timer starts)
        torch.zeros(1, device=config.device)
        from ..pools import cuda as _driver  # noqa: F401
        from ..pools.devices import resolve_device

        resolve_device(config.device)
    t2 = time.perf_counter()
    model, report = load_model(config.model, dtype=config.dtype, device=config.device, config=config.attach,
                               load_format=config.load_format, impl=config.model_impl)
    t3 = time.perf_counter()
    if overlap is not None:
        overlap()
    hf_config = read_json(Path(config.model) / "config.json")
    limit = config.max_model_len or int(hf_config.get("max_position_embeddings", 2048))
    generator = Generator(model, tokenizer, max_model_len=limit, eos_ids=eos_ids(config.model, tokenizer),
                          vocab_size=int(hf_config["vocab_size"]))
    # the kernels' first-use costs are paid before /health says ready
    with torch.inference_mode():
        if hasattr(model, "warm_up"):
            model.warm_up()
        else:
            generator.step(torch.tensor([generator.encode("A")[:1] or [0]], device=generator.device), None)
    if config.device.startswith("cuda"):
        torch.cuda.synchronize()
    t4 = time.perf_counter()
    phases = {"imports": t_imports, "cuda_context": t2 - t1, "tokenizer": t1 - t0, "model_build": report.build_s,
              "weights": report.weights_s, "warmup": t4 - t3}
    return generator, Started(phases, report.engine, str(report.source))


def eos_ids(model_dir: str, tokenizer) -> set[int]:
    """Where generation stops: generation_config.json's eos ids, else config.json's, else the tokenizer's."""
    for name in ("generation_config.json", "config.json"):
        eos = read_json(Path(model_dir) / name).get("eos_token_id")
        if eos is not None:
            return set(eos if isinstance(eos, list) else [eos])
    return {tokenizer.eos_token_id} - {None}


def reload_weights(config: ServeConfig) -> tuple[dict, str]:
    """This start's weights again (a wake from a deep park): ``(tensors, where from: gpu | host | disk)``, by
    the same policy as the start (strict: WeightCacheUnusable when the keeper no longer holds them)."""
    from ..loading.checkpoint import open_checkpoint
    from ..loading.policy import Source, load_tensors

    ckpt = open_checkpoint(config.model, validate=False)
    weights = load_tensors(ckpt, dtype=ckpt.resolve_dtype(config.dtype), device=config.device, config=config.attach,
                           use_cache=config.load_format == "hotweights")
    where = "disk" if weights.source is not Source.CACHE else "gpu" if config.device.startswith("cuda") else "host"
    return weights.tensors, where


def _may_park(config: ServeConfig) -> bool:
    """The park endpoints are served where only this host reaches them (a loopback address), or where asked
    for (``VLLM_SERVER_DEV_MODE=1``, as vLLM gates its own)."""
    import ipaddress

    if os.environ.get("VLLM_SERVER_DEV_MODE") == "1" or config.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(config.host).is_loopback
    except ValueError:
        return False


class SideImport:
    """A module imported on a side thread: ``start()``, then ``module()`` waits and re-raises its error."""

    def __init__(self, name: str) -> None:
        self.name, self._module, self._error = name, None, None
        self._thread = threading.Thread(target=self._run, name=f"import {name}", daemon=True)

    def _run(self) -> None:
        try:
            self._module = importlib.import_module(self.name)
        except BaseException as exc:  # re-raised on the main thread
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def module(self):
        if self._thread.ident is None:
            self._run()  # never started: import here
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._module


def run(config: ServeConfig) -> int:
    for extra in ("starlette", "pydantic", "uvicorn"):  # a missing extra is one line before anything loads
        if importlib.util.find_spec(extra) is None:
            raise ModuleNotFoundError(f"No module named {extra!r}", name=extra)
    sock = take_port(config.host, config.port, config.attach.socket_dir)  # before the model loads
    web = SideImport("hotweights.serve.web")  # starlette, pydantic, uvicorn, while the model loads
    generator, started = load(config, overlap=web.start)
    loaded = process_age_s()
    name = config.served_model_name or config.model

    web_module = web.module()
    metrics = web_module.ServerMetrics()

    def on_start() -> None:
        ready = process_age_s()
        phases = {**started.phases, "listening": ready - loaded}
        metrics.started({**phases, "ready": ready})
        logger.info(evidence.startup(phases, engine=started.engine, source=started.source, ready_s=ready))

    gc.freeze()  # the model, the tokenizer and the HTTP stack live as long as the server too
    import uvicorn

    from .engine import Engine
    from .park import Parking

    engine = Engine(generator)
    parking = Parking(engine, generator.model, name, lambda: reload_weights(config))
    app = web_module.create_app(generator, name, on_start, metrics, engine, parking if _may_park(config) else None)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            # SIGINT/SIGTERM: end every generation now (within a decoding step), so that uvicorn's graceful
            # shutdown is not held by a stream a client still reads, or by one nobody reads any more
            logger.info("signal received: signum=%d; stopping", sig)
            engine.stop()
            super().handle_exit(sig, frame)

    logger.info("serving: model=%s url=http://%s:%d", name, config.host, config.port)
    server = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                            access_log=config.access_log)
    if config.access_log:  # uvicorn's own notices stay at warning; a line per request, as vLLM's server writes
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    Server(server).run(sockets=[sock])
    return 0
