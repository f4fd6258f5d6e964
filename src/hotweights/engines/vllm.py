"""vLLM plugin: ``--load-format hotweights`` for stock ``vllm serve``.

Registered from the ``vllm.general_plugins`` entry point, so vLLM constructs the loader
inside its worker process. Two ways to serve weights from the daemon:

- **Engine layout** (key layout ``vllm/<version>``, with tp/pp rank, dtype, quantization
  and KV-cache dtype): the tensors vLLM itself ends up with after loading and
  ``process_weights_after_loading``. Attach builds the model on the meta device,
  registers the cached tensors (tied weights stay one object; tensors created by
  post-processing are registered too), then reruns ``process_weights_after_loading``
  under ``weights_already_processed`` so quantization methods rebuild their Python-side
  state without transforming the weights. Filled by write-through (``publish: true``: a
  disk load publishes its tensors one pool at a time and keeps running on the published
  copy) or by ``hotweights preload --engine vllm``. Evidence: ``(mode=zero_copy)``.
- **Checkpoint layout, streamed**: an entry made by plain ``hotweights preload`` is
  attached zero-copy and fed to vLLM's own ``model.load_weights`` instead of the disk, so
  vLLM's loaders fuse, slice for TP and quantize as usual. Evidence: ``(mode=stream)``
  plus ``Streamed N cached tensors ...``.

``layout`` in the extra config picks: ``auto`` (default: engine layout, else checkpoint
layout, else the fallback policy), ``engine`` or ``checkpoint``.

vLLM's CPU build packs unquantized linear weights into oneDNN handles during
post-processing and drops the weight tensors. The engine layout keeps, for those layers,
the weights as loaded (fused and sharded, before packing); attach packs them again, which
is a copy in the engine. Everything else (embeddings, norms, buffers) stays zero-copy.
On the GPU, unquantized post-processing keeps the tensors, so the whole model is mapped.

Fallback and strict policy and the evidence lines are hotweights' own. A disk fallback
runs vLLM's ``DefaultModelLoader`` built from a copy of the ``LoadConfig`` with
``load_format="auto"`` and no extra config. Models given as hub ids are not supported
(local directories only).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

from .. import evidence
from ..config import AttachConfig
from ..errors import ManifestError, WeightCacheUnusable

logger = logging.getLogger(__name__)
LOAD_FORMAT = "hotweights"
LAYOUTS = ("auto", "engine", "checkpoint")


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


def split_extra_config(extra: Any) -> tuple[str, AttachConfig]:
    """``--model-loader-extra-config`` -> (layout, AttachConfig); unknown keys raise, named."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config must be a JSON object for load format {LOAD_FORMAT}, "
                         f"got {type(extra).__name__}")
    extra = dict(extra)
    layout = extra.pop("layout", "auto")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    try:
        return layout, AttachConfig.from_dict(extra)
    except ValueError as exc:
        if "unknown weight-cache config keys" in str(exc):
            raise ValueError(f"{exc} (plus 'layout' for the vLLM plugin)") from None
        raise


def sleep_mode_refusal(enable_sleep_mode: bool, mode: str, layout: str) -> str | None:
    """Why zero_copy cannot run with sleep mode, or None when the combination is fine."""
    if enable_sleep_mode and mode == "zero_copy" and layout != "checkpoint":
        return ("load format hotweights with mode=zero_copy cannot be used with --enable-sleep-mode: sleep mode "
                "offloads and discards weights through vLLM's own allocator, but zero-copy weights live in the "
                "daemon's shared pools. Use --model-loader-extra-config '{\"mode\": \"copy\"}' (weights become "
                "engine-owned), or '{\"layout\": \"checkpoint\"}' (streamed into vLLM's own weights), or drop "
                "--enable-sleep-mode")
    return None


@contextlib.contextmanager
def keep_cpu_packed_weights() -> Iterator[dict[int, Any]]:
    """While active, remember each weight vLLM's CPU GEMM dispatch is about to drop.

    Yields ``id(layer) -> weight`` (the tensor as loaded, before oneDNN/sgl packing).
    """
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    kept: dict[int, Any] = {}

    def dispatch(layer, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if remove_weight and weight is not None and not weight.is_meta:
            kept[id(layer)] = weight.data
        original(layer, remove_weight)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch
    try:
        yield kept
    finally:
        layer_utils.dispatch_cpu_unquantized_gemm = original


def engine_tensors(model, kept: dict[int, Any]) -> tuple[dict[str, Any], dict[str, str], dict[str, tuple[Any, str]]]:
    """(name -> tensor, alias -> name, name -> (module, leaf)) of everything ``model`` holds.

    A weight the CPU packing replaced by an empty tensor is taken from ``kept``.
    """
    tensors: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    owners: dict[str, tuple[Any, str]] = {}
    first: dict[int, str] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for table in (module._parameters, module._buffers):
            for leaf, t in table.items():
                if t is None:
                    continue
                name = f"{prefix}.{leaf}" if prefix else leaf
                owners[name] = (module, leaf)
                if id(t) in first:
                    aliases[name] = first[id(t)]
                    continue
                first[id(t)] = name
                if t.is_meta:
                    raise ManifestError(f"{name} is still on the meta device after loading; cannot publish")
                data = t.data
                if leaf == "weight" and data.numel() == 0 and id(module) in kept:
                    data = kept[id(module)]
                tensors[name] = data.detach()
    return tensors, aliases, owners


def register_tensors(model, tensors: dict[str, Any]) -> None:
    """Make ``tensors`` the parameters/buffers of a model built on the meta device."""
    import torch
    from torch import nn

    modules = dict(model.named_modules(remove_duplicate=False))
    made: dict[int, Any] = {}
    unknown = []
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        module = modules.get(prefix)
        if module is None:
            unknown.append(name)
            continue
        if leaf in module._buffers:
            module._buffers[leaf] = t
            continue
        param = made.get(id(t))
        if param is None:  # tied weights: one view object -> one Parameter under every name
            param = made[id(t)] = nn.Parameter(t, requires_grad=False)
        module._parameters.pop(leaf, None)
        module.register_parameter(leaf, param)
    if unknown:
        raise ManifestError(f"{len(unknown)} cached tensors have no module in this model, e.g. {unknown[:3]}")
    leftover = [f"{p}.{leaf}" if p else leaf for p, m in model.named_modules()
                for table in (m._parameters, m._buffers) for leaf, t in table.items()
                if isinstance(t, torch.Tensor) and t.is_meta]
    if leftover:
        raise ManifestError(f"the cached entry lacks {len(leftover)} tensors this model needs, e.g. {leftover[:3]}")


def _loader_class():
    import torch
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from ..loading.attach import AttachResult, attach_tensors
    from ..loading.checkpoint import checkpoint_key, open_checkpoint
    from ..loading.devices import Device, gpu_uuid
    from ..loading.digest import DigestCache
    from ..loading.policy import publish_from_disk
    from ..loading.writethrough import publish_tensors

    def vllm_version() -> str:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))

    class HotweightsModelLoader(BaseModelLoader):
        """Attaches vLLM's own post-processed tensors, or streams cached checkpoint tensors."""

        def __init__(self, load_config) -> None:
            super().__init__(load_config)
            self.layout, self.config = split_extra_config(load_config.model_loader_extra_config)
            disk = copy.copy(load_config)
            if dataclasses.is_dataclass(disk):
                disk = dataclasses.replace(load_config, load_format="auto", model_loader_extra_config={})
            else:
                disk.load_format, disk.model_loader_extra_config = "auto", {}
            self._disk_config = disk
            self._stream: AttachResult | None = None
            self._computed: dict[tuple, tuple] = {}  # get_external_weight_memory and load_model share keys

        # -- keys ------------------------------------------------------------------------

        def _device(self, vllm_config) -> Device:
            device = vllm_config.device_config.device
            device = torch.device(device) if not isinstance(device, torch.device) else device
            if device.type != "cuda":
                return Device("cpu", "host", -1)
            index = device.index if device.index is not None else torch.cuda.current_device()
            return Device("cuda", gpu_uuid(index), index)

        def _keys(self, vllm_config, model_config):
            memo = (model_config.model, str(model_config.dtype), id(vllm_config))
            if memo not in self._computed:
                self._computed[memo] = self._compute_keys(vllm_config, model_config)
            return self._computed[memo]

        def _compute_keys(self, vllm_config, model_config):
            from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank,
                                          get_tensor_model_parallel_world_size)

            dev = self._device(vllm_config)
            dtype = str(model_config.dtype).removeprefix("torch.")
            ckpt = open_checkpoint(model_config.model, validate=False)  # headers only: the key needs no more
            layout = f"vllm/{vllm_version()}"
            quant = getattr(model_config, "quantization", None)
            if quant:
                layout += f"/quant={quant}"
            cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
            if cache_dtype and cache_dtype != "auto":
                layout += f"/kv={cache_dtype}"
            pp = get_pp_group()
            digests = DigestCache()  # read digests.json once for both keys
            engine = checkpoint_key(ckpt, dtype=dtype, device_kind=dev.kind, device_id=dev.uuid, cache=digests,
                                    tp_size=get_tensor_model_parallel_world_size(),
                                    tp_rank=get_tensor_model_parallel_rank(), pp_size=pp.world_size,
                                    pp_rank=pp.rank_in_group, layout=layout)
            checkpoint = checkpoint_key(ckpt, dtype=dtype, device_kind=dev.kind, device_id=dev.uuid, cache=digests)
            return ckpt, dev, dtype, engine, checkpoint

        # -- vLLM API ----------------------------------------------------------------------

        def download_model(self, model_config) -> None:
            open_checkpoint(model_config.model)  # local directories only; fails with a clear message

        def get_external_weight_memory(self, vllm_config) -> int:
            """Bytes of an engine-layout entry this worker will map zero-copy (0 otherwise)."""
            from ..loading.policy import entry_nbytes

            if self.config.mode != "zero_copy" or self.layout == "checkpoint":
                return 0
            try:
                _, _, _, engine, _ = self._keys(vllm_config, vllm_config.model_config)
            except Exception as exc:  # never block startup on sizing; the load itself reports problems
                logger.warning("cannot size the cached weights: %s; assuming none are external", exc)
                return 0
            return entry_nbytes(engine, self.config)

        def load_model(self, vllm_config, model_config, prefix: str = ""):
            refusal = sleep_mode_refusal(bool(getattr(model_config, "enable_sleep_mode", False)),
                                         self.config.mode, self.layout)
            if refusal:
                raise ValueError(refusal)
            ckpt, dev, dtype, engine_key, ckpt_key = self._keys(vllm_config, model_config)
            reasons = []
            absent = False
            if self.layout in ("auto", "engine"):
                result = attach_tensors(engine_key, self.config)
                if result.ok:
                    try:
                        return self._build(vllm_config, model_config, prefix, result)
                    except (ManifestError, RuntimeError, ValueError) as exc:
                        result = AttachResult("unusable", f"engine-layout entry does not fit this model: {exc}")
                absent = result.status == "absent"  # no daemon: the other layout cannot do better
                reasons.append(f"engine layout: {result.reason}" if self.layout == "auto" and not absent
                               else result.reason)
            if self.layout in ("auto", "checkpoint") and not absent:
                quiet = dataclasses.replace(self.config, state_timeout_s=0.0) if reasons else self.config
                result = attach_tensors(ckpt_key, quiet, evidence_mode="stream")
                if result.ok:
                    if reasons:
                        logger.info("no usable engine-layout entry (%s); streaming the checkpoint-layout entry",
                                    reasons[0])
                    return self._streamed(vllm_config, model_config, prefix, result)
                reasons.append(f"checkpoint layout: {result.reason}" if self.layout == "auto" else result.reason)
            reason = "; ".join(reasons)
            if not self.config.fallback:
                raise WeightCacheUnusable(evidence.strict_failure(reason), reason=reason)
            logger.warning(evidence.falling_back(reason))
            if self.config.publish and self.layout == "checkpoint":
                result = publish_from_disk(ckpt, dtype, dev, self.config, evidence_mode="stream")
                if result.ok:
                    return self._streamed(vllm_config, model_config, prefix, result)
                logger.warning("write-through publish not attachable: reason=%s; loading from disk", result.reason)
            if not self.config.publish:
                return DefaultModelLoader(self._disk_config).load_model(vllm_config, model_config, prefix)
            with keep_cpu_packed_weights() as kept:
                model = DefaultModelLoader(self._disk_config).load_model(vllm_config, model_config, prefix)
            self._write_through(model, kept, engine_key, dev)
            return model

        def load_weights(self, model, model_config) -> None:
            """Checkpoint tensors into an already built model: from the streamed entry, else disk."""
            result, self._stream = self._stream, None
            if result is None:
                DefaultModelLoader(self._disk_config).load_weights(model, model_config)
                return
            start = time.perf_counter()
            with torch.no_grad():
                loaded = model.load_weights(iter(result.tensors.items()))
            expected = {name for name, _ in model.named_parameters()}
            missing = sorted(expected - set(loaded)) if loaded is not None else []
            if missing:
                raise ValueError(f"the cached checkpoint did not provide {len(missing)} parameters vLLM expects, "
                                 f"e.g. {missing[:3]}")
            logger.info("Streamed %d cached tensors into vLLM's weight loaders in %.2f s (layout=checkpoint)",
                        len(result.tensors), time.perf_counter() - start)

        # -- paths -------------------------------------------------------------------------

        def _streamed(self, vllm_config, model_config, prefix, result):
            self._stream = result
            return super().load_model(vllm_config, model_config, prefix)  # calls self.load_weights

        def _build(self, vllm_config, model_config, prefix, result):
            from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
            from vllm.model_executor.utils import weights_already_processed
            from vllm.utils.torch_utils import set_default_torch_dtype

            start = time.perf_counter()
            load_device = vllm_config.device_config.device if self.load_config.device is None \
                else self.load_config.device
            target = torch.device(load_device)
            with set_default_torch_dtype(model_config.dtype):
                with torch.device("meta"):
                    model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
                register_tensors(model, result.tensors)
                registered = time.perf_counter()
                with weights_already_processed(), torch.no_grad():
                    process_weights_after_loading(model, model_config, target)
            end = time.perf_counter()
            logger.info("Built the vLLM model from %d cached engine-layout tensors in %.2f s (layout=%s; meta "
                        "init + register %.2f s, post-processing %.2f s)", len(result.tensors), end - start,
                        result.manifest.key.layout, registered - start, end - registered)
            return model.eval()

        def _write_through(self, model, kept, key, dev) -> None:
            try:
                tensors, aliases, owners = engine_tensors(model, kept)
            except ManifestError as exc:
                logger.warning("write-through skipped: %s", exc)
                return
            packed = {name for name, t in tensors.items() if owners[name][1] == "weight"
                      and getattr(owners[name][0], "weight").numel() == 0}
            kept.clear()

            def repoint(name: str, view) -> None:
                module, leaf = owners[name]
                if name in packed:
                    return  # the engine uses its packed copy; the kept original goes with the entry
                current = module._parameters.get(leaf)
                if current is not None:
                    current.data = view
                else:
                    module._buffers[leaf] = view

            try:  # publish_tensors consumes the dict: each original goes once its pool is sealed
                publish_tensors(tensors, key, self.config, device=dev, aliases=aliases, repoint=repoint)
            except Exception as exc:  # the engine already works from its disk load
                logger.warning("write-through publish failed: %s; serving from the disk load", exc)

    return HotweightsModelLoader
