"""``HotweightsModelLoader``: vLLM's model loader for load format ``hotweights``.

Imports vLLM at the top: ``register()`` imports this module lazily, inside vLLM.

- **Engine layout** (key layout ``vllm/<version>``, with tp/pp rank, dtype, quantization
  and KV-cache dtype): the tensors vLLM itself ends up with after loading and
  ``process_weights_after_loading``. Attach builds the model on the meta device,
  installs the cached tensors (``attach_module(exact=False)``: tied weights stay one
  object; tensors created by post-processing are registered too), then reruns
  ``process_weights_after_loading`` under ``weights_already_processed`` so quantization
  methods rebuild their Python-side state without transforming the weights. Filled by
  write-through (``publish: true``) or ``hotweights preload --engine vllm``.
- **Checkpoint layout, streamed**: an entry made by plain ``hotweights preload`` is
  attached zero-copy and fed to vLLM's own ``model.load_weights`` instead of the disk.
  Evidence: ``(mode=stream)`` plus ``Streamed N cached tensors ...``.

vLLM's CPU build packs unquantized linear weights during post-processing (see
``patches.keep_cpu_packed_weights``); the engine layout keeps those weights as loaded and
attach packs them again (a copy in the engine). On the GPU the whole model is mapped.

The fallback and strict policy is ``loading.policy.attach_first``. A disk load runs
vLLM's ``DefaultModelLoader`` built from a copy of the ``LoadConfig`` with
``load_format="auto"`` and no extra config. Local model directories only.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time

import torch
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from ... import evidence
from ...client import connect_for
from ...errors import DaemonUnavailable, HotweightsError, ManifestError
from ...loading.attach import AttachResult, attach_tensors
from ...loading.checkpoint import open_checkpoint
from ...loading.diagnosis import Candidate
from ...loading.policy import attach_first
from ...loading.preload import publish_from_disk
from ...loading.publish import publish_tensors
from ..modules import Slot, attach_module, module_tensors
from . import capabilities
from .keys import Keys, candidates, keys_for, maps_zero_copy
from .options import split_extra_config
from .patches import keep_cpu_packed_weights
from ..writes import WriteGuard, ZeroCopyWrite, own_buffers, storages

logger = logging.getLogger(__name__)


class HotweightsModelLoader(BaseModelLoader):
    """Attaches vLLM's own post-processed tensors, or streams cached checkpoint tensors."""

    def __init__(self, load_config) -> None:
        super().__init__(load_config)
        self.layout, self.config = split_extra_config(load_config.model_loader_extra_config)
        if dataclasses.is_dataclass(load_config):
            disk = dataclasses.replace(load_config, load_format="auto", model_loader_extra_config={})
        else:
            disk = copy.copy(load_config)
            disk.load_format, disk.model_loader_extra_config = "auto", {}
        self._disk_config = disk
        self._stream: AttachResult | None = None
        self.caps = capabilities.detect()
        if (line := capabilities.missing_line(self.caps)) and not _said_once(line):
            logger.info(line)

    # -- vLLM API --------------------------------------------------------------------------

    def download_model(self, model_config) -> None:
        open_checkpoint(model_config.model)  # local directories only; fails with a clear message

    def candidates(self, vllm_config) -> tuple[list[Candidate], list[str]]:
        """The entries this worker may attach, in order, and why others are left out."""
        return candidates(keys_for(vllm_config, self.config), self.layout, self.caps,
                          getattr(vllm_config.model_config, "quantization", None))

    def get_external_weight_memory(self, vllm_config) -> int:
        """Bytes of an engine-layout entry this worker will map zero-copy (0 otherwise)."""
        if not maps_zero_copy(self.config, self.layout):
            return 0
        try:
            key = keys_for(vllm_config, self.config).engine
            with connect_for(self.config) as client:
                return client.entry_nbytes(key)
        except DaemonUnavailable:
            return 0
        except Exception as exc:  # never block startup on sizing; the load itself reports problems
            logger.warning("cannot size the cached weights: %s; assuming none are external", exc)
            return 0

    def load_model(self, vllm_config, model_config, prefix: str = ""):  # noqa: C901
        keys = keys_for(vllm_config, self.config)
        candidates, skipped = self.candidates(vllm_config)

        def use(cand: Candidate, attached: AttachResult):
            if cand.key is not keys.engine:
                return self._streamed(vllm_config, model_config, prefix, attached)
            try:
                return self._build(vllm_config, model_config, prefix, attached)
            except ZeroCopyWrite as exc:
                logger.warning("vLLM's post-processing: %s; attaching this engine-layout entry by copy", exc)
                copied = attach_tensors(keys.engine, dataclasses.replace(self.config, mode="copy"))
                if not copied.ok:
                    raise ValueError(copied.reason) from None
                return self._build(vllm_config, model_config, prefix, copied)
            except RuntimeError as exc:
                if "CUDA error" not in str(exc):
                    raise
                raise HotweightsError(  # the context is gone: no fallback can run in this process
                    f"CUDA failed while vLLM post-processed the mapped engine-layout entry ({exc}); this process "
                    f"cannot continue. Start with --model-loader-extra-config '{{\"mode\": \"copy\"}}' and "
                    f"report it") from exc

        model, _ = attach_first(candidates, self.config, use, skipped=skipped)
        if model is not None:
            return model
        if self.config.publish and self.layout == "checkpoint":
            attached = publish_from_disk(keys.ckpt, keys.dtype, keys.device, self.config, evidence_mode="stream")
            if attached.ok:
                return self._streamed(vllm_config, model_config, prefix, attached)
        if not self.config.publish:
            return DefaultModelLoader(self._disk_config).load_model(vllm_config, model_config, prefix)
        with keep_cpu_packed_weights() as kept:
            model = DefaultModelLoader(self._disk_config).load_model(vllm_config, model_config, prefix)
        self._write_through(model, kept, keys)
        return model

    def load_weights(self, model, model_config) -> None:
        """Checkpoint tensors into an already built model: from the streamed entry, else disk."""
        attached, self._stream = self._stream, None
        if attached is None:
            DefaultModelLoader(self._disk_config).load_weights(model, model_config)
            return
        start = time.perf_counter()
        with torch.no_grad():
            loaded = model.load_weights(iter(attached.tensors.items()))
        expected = {name for name, _ in model.named_parameters()}
        missing = sorted(expected - set(loaded)) if loaded is not None else []
        if missing:
            raise ValueError(f"the cached checkpoint did not provide {len(missing)} parameters vLLM expects, "
                             f"e.g. {missing[:3]}")
        logger.info("Streamed %d cached tensors into vLLM's weight loaders in %.2f s (layout=checkpoint)",
                    len(attached.tensors), time.perf_counter() - start)

    # -- paths -----------------------------------------------------------------------------

    def _streamed(self, vllm_config, model_config, prefix, attached: AttachResult):
        self._stream = attached
        return super().load_model(vllm_config, model_config, prefix)  # calls self.load_weights

    def _build(self, vllm_config, model_config, prefix, attached: AttachResult):
        from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
        from vllm.utils.torch_utils import set_default_torch_dtype

        start = time.perf_counter()
        load_device = getattr(self.load_config, "device", None) or vllm_config.device_config.device
        # GPU mappings are read-only: the engine owns its buffers, and no op may write a weight
        zero_copy = attached.manifest.key.device_kind == "cuda" and attached.mode == "zero_copy"
        mapped = storages(attached.tensors.values()) if zero_copy else frozenset()
        already = self.caps.weights_already_processed or contextlib.nullcontext
        with set_default_torch_dtype(model_config.dtype):
            with torch.device("meta"):
                model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
            attach_module(model, attached.tensors, exact=False)
            own_buffers(model, mapped)
            registered = time.perf_counter()
            with already(), torch.no_grad(), WriteGuard(mapped):
                process_weights_after_loading(model, model_config, torch.device(load_device))
        end = time.perf_counter()
        logger.info("Built the vLLM model from %d cached engine-layout tensors in %.2f s (layout=%s; meta "
                    "init + register %.2f s, post-processing %.2f s)", len(attached.tensors), end - start,
                    attached.manifest.key.layout, registered - start, end - registered)
        return model.eval()

    def _write_through(self, model, kept: dict, keys: Keys) -> None:
        def unpacked(slot: Slot, t: torch.Tensor) -> torch.Tensor:
            # a weight the CPU packing replaced by an empty tensor is published as loaded
            return kept.get(id(slot.owner), t) if slot.leaf == "weight" and t.numel() == 0 else t

        try:
            tensors, aliases, owners = module_tensors(model, substitute=unpacked)
        except ManifestError as exc:
            logger.warning("%s: %s", evidence.WT_SKIPPED, exc)
            return
        packed = {name for name, slot in owners.items() if slot.leaf == "weight"
                  and slot.owner.weight.numel() == 0}
        kept.clear()

        def repoint(name: str, view: torch.Tensor) -> None:
            if name in packed:
                return  # the engine uses its packed copy; the kept original goes with the entry
            slot = owners[name]
            current = slot.owner._parameters.get(slot.leaf)
            if current is not None:
                current.data = view
            else:
                slot.owner._buffers[slot.leaf] = view

        try:  # publish_tensors consumes the dict: each original goes once its pool is sealed
            publish_tensors(tensors, keys.engine, self.config, device=keys.device, aliases=aliases, repoint=repoint)
        except Exception as exc:  # the engine already works from its disk load
            logger.warning("%s: %s; serving from the disk load", evidence.WT_PUBLISH_FAILED, exc)


_SAID: set[str] = set()


def _said_once(line: str) -> bool:
    """True if ``line`` was already logged by this process (vLLM builds loaders repeatedly)."""
    seen = line in _SAID
    _SAID.add(line)
    return seen
