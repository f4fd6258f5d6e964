"""vLLM plugin: ``--load-format hotweights`` for stock ``vllm serve``.

``register`` is the ``vllm.general_plugins`` entry point; vLLM calls it in every process,
and constructs the loader inside its workers. ``loader`` (imports vLLM, so imported
lazily here) serves the engine layout and the streamed checkpoint layout; ``options``
parses the extra config; ``capabilities`` detects what the installed vLLM offers;
``writes`` keeps vLLM from writing into read-only GPU mappings; ``budget`` counts mapped
weights against ``--gpu-memory-utilization`` where vLLM does not; ``preflight`` fails
strict starts early; ``cpu_packing`` shims vLLM's CPU build; ``preload`` is
``hotweights preload --engine vllm``.
"""

from __future__ import annotations

import logging

from .options import LOAD_FORMAT


def register() -> None:
    """``vllm.general_plugins`` entry point: register load format ``hotweights``; on a GPU
    build, budget the mapped weights where vLLM does not (``budget``); fail a strict start
    that cannot be served now, not after vLLM's start-up (``preflight``)."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.platforms import current_platform

    _log_to_stderr()
    from . import budget, preflight
    from .loader import HotweightsModelLoader

    register_model_loader(LOAD_FORMAT)(HotweightsModelLoader)
    if current_platform.is_cuda_alike():
        budget.install()
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


