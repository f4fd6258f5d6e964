"""vLLM plugin: ``--load-format hotweights`` for stock ``vllm serve``.

Registered from the ``vllm.general_plugins`` entry point, so vLLM constructs the loader
inside its worker process. This module implements the **checkpoint layout, streamed**:
the entry made by plain ``hotweights preload`` (checkpoint tensors after the dtype cast)
is attached zero-copy and fed to vLLM's own ``model.load_weights`` instead of the disk.
vLLM's weight loaders fuse, slice for TP and quantize as usual, so it works for every
model, quantization and TP size vLLM supports; the evidence line says ``mode=stream``.

Fallback and strict policy and the evidence lines are hotweights' own. A disk fallback
runs vLLM's ``DefaultModelLoader`` built from a copy of the ``LoadConfig`` with
``load_format="auto"`` and no extra config (it picks files by load format). With
``publish: true`` the fallback reads the checkpoint into pools, publishes them, and
streams from the published entry, so the next start is warm.

Not covered yet: the engine layout (vLLM's post-processed tensors, zero-copy, with
``get_external_weight_memory``); until then vLLM owns a copy of the weights and
``get_external_weight_memory`` is 0. Models given as hub ids (local directories only).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time

from .. import evidence
from ..config import AttachConfig
from ..errors import WeightCacheUnusable

logger = logging.getLogger(__name__)
LOAD_FORMAT = "hotweights"


def register() -> None:
    """``vllm.general_plugins`` entry point: register load format ``hotweights``."""
    from vllm.model_executor.model_loader import register_model_loader

    _log_to_stderr()
    register_model_loader(LOAD_FORMAT)(_loader_class())


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


def _loader_class():
    import torch
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from ..loading.attach import attach_tensors
    from ..loading.checkpoint import checkpoint_key, open_checkpoint
    from ..loading.devices import Device, gpu_uuid
    from ..loading.policy import publish_from_disk

    class HotweightsModelLoader(BaseModelLoader):
        """Streams cached checkpoint tensors into vLLM's weight loaders."""

        def __init__(self, load_config) -> None:
            super().__init__(load_config)
            extra = load_config.model_loader_extra_config or {}
            if not isinstance(extra, dict):
                raise ValueError(f"model_loader_extra_config must be a JSON object for load format "
                                 f"{LOAD_FORMAT}, got {type(extra).__name__}")
            self.config = AttachConfig.from_dict(extra)  # unknown keys raise, named
            disk = copy.copy(load_config)
            if dataclasses.is_dataclass(disk):
                disk = dataclasses.replace(load_config, load_format="auto", model_loader_extra_config={})
            else:
                disk.load_format, disk.model_loader_extra_config = "auto", {}
            self._disk_config = disk

        def download_model(self, model_config) -> None:
            open_checkpoint(model_config.model)  # local directories only; fails with a clear message

        def get_external_weight_memory(self, vllm_config) -> int:
            return 0  # streamed: vLLM owns its copy of the weights

        def load_weights(self, model, model_config) -> None:
            start = time.perf_counter()
            param = next(model.parameters())
            dev = (Device("cpu", "host", -1) if param.device.type != "cuda"
                   else Device("cuda", gpu_uuid(param.device.index or 0), param.device.index or 0))
            dtype = str(model_config.dtype).removeprefix("torch.")
            ckpt = open_checkpoint(model_config.model)
            key = checkpoint_key(ckpt, dtype=dtype, device_kind=dev.kind, device_id=dev.uuid)
            result = attach_tensors(key, self.config, evidence_mode="stream")
            if not result.ok:
                if not self.config.fallback:
                    raise WeightCacheUnusable(evidence.strict_failure(result.reason), reason=result.reason)
                logger.warning(evidence.falling_back(result.reason))
                if not self.config.publish:
                    DefaultModelLoader(self._disk_config).load_weights(model, model_config)
                    return
                result = publish_from_disk(ckpt, dtype, dev, self.config, evidence_mode="stream")
                if not result.ok:
                    logger.warning("write-through publish not attachable: reason=%s; loading from disk",
                                   result.reason)
                    DefaultModelLoader(self._disk_config).load_weights(model, model_config)
                    return
            with torch.no_grad():
                loaded = model.load_weights(iter(result.tensors.items()))
            expected = {name for name, _ in model.named_parameters()}
            missing = sorted(expected - set(loaded)) if loaded is not None else []
            if missing:
                raise ValueError(f"the cached checkpoint did not provide {len(missing)} parameters vLLM expects, "
                                 f"e.g. {missing[:3]}")
            logger.info("Streamed %d cached tensors into vLLM's weight loaders in %.2f s (layout=checkpoint)",
                        len(result.tensors), time.perf_counter() - start)

    return HotweightsModelLoader
