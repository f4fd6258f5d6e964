"""vLLM plugin: ``--load-format hotweights`` for stock ``vllm serve``.

``register`` is the ``vllm.general_plugins`` entry point. Which process runs each file:

| file | runs in | owns |
|---|---|---|
| ``__init__`` | every vLLM process (plugin load) | ``register``: the loader, the patches, the preflight |
| ``preflight`` | vLLM's front process (plugin load); the hotweights CLI | failing a strict start no entry can serve |
| ``patches`` | every vLLM process | every touch of vLLM's internals, listed with why and until when |
| ``loader`` | vLLM worker | ``HotweightsModelLoader``: keys, attach, stream, write-through |
| ``options`` | vLLM worker | the extra config -> ``(layout, AttachConfig)``; the sleep-mode rule |
| ``capabilities`` | vLLM worker | what the installed vLLM offers, detected by code |
| ``writes`` | vLLM worker | no write reaches a read-only mapped pool |
| ``budget`` | vLLM GPU worker | the GPU budget with weights that live outside the engine |
| ``launcher`` | hotweights CLI | ``hotweights vllm ARGS``: the command vLLM becomes |
| ``preload`` | hotweights CLI | ``hotweights preload --engine vllm`` (drives a vLLM process) |
| ``publish`` | a process of its own (``preload``) | the loader run without a vLLM start: one rank's engine layout |
| ``compile_key`` | every vLLM process (``patches``) | a model's compile-cache factor from its config files |

The hooks fire in vLLM's worker life cycle in this order: plugin load (``register``) ->
``Worker.init_device`` -> ``request_memory`` (``budget``) -> ``Worker.load_model`` (heap
freeze) -> the loader's ``load_model`` (``loader``; write-through's CPU packing shim).
"""

from __future__ import annotations

import logging

from .options import LOAD_FORMAT


def register() -> None:
    """``vllm.general_plugins`` entry point: register load format ``hotweights``, install the
    patches this build needs, and fail a strict start that cannot be served now, not after
    vLLM's start-up (``preflight``)."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.platforms import current_platform

    _log_to_stderr()
    from . import patches, preflight
    from .loader import HotweightsModelLoader

    register_model_loader(LOAD_FORMAT)(HotweightsModelLoader)
    patches.install(gpu=current_platform.is_cuda_alike())
    preflight.check()


def _log_to_stderr() -> None:
    # vLLM configures only its own loggers; the evidence lines must reach the server log
    root = logging.getLogger("hotweights")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [hotweights] %(message)s",
                                               "%m-%d %H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
