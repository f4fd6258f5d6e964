"""vLLM plugin: ``--load-format hotweights`` for stock ``vllm serve``.

``register`` is the ``vllm.general_plugins`` entry point; vLLM calls it in every process,
and constructs the loader inside its workers. ``loader`` (imports vLLM, so imported
lazily here) serves the engine layout and the streamed checkpoint layout; ``options``
parses the extra config; ``cpu_packing`` shims vLLM's CPU build; ``preload`` is
``hotweights preload --engine vllm``.
"""

from __future__ import annotations

import logging

from .options import LOAD_FORMAT


def register() -> None:
    """``vllm.general_plugins`` entry point: register load format ``hotweights``."""
    from vllm.model_executor.model_loader import register_model_loader

    _log_to_stderr()
    from .loader import HotweightsModelLoader

    register_model_loader(LOAD_FORMAT)(HotweightsModelLoader)


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


