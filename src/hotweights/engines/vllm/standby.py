"""vLLM's part of the warm standby (``hotweights/standby/``): what to import ahead, what pins a standby.

Data only: the launcher reads it before vLLM is imported.

What vLLM's API server imports anyway, and no more: a fork from it is vLLM's own tested path. The engine
core's worker modules (the GPU worker, model runner, sampler) stay out: imported before the fork, a
Triton kernel of vLLM 0.26's sampler failed in the forked engine core on an H200 ("Pointer argument
cannot be accessed from Triton"), while the same start with them imported after the fork ran.

The engine core: the launcher asks for ``VLLM_WORKER_MULTIPROC_METHOD=fork`` (see ``launcher``), so
vLLM forks its EngineCore (and TP workers) from this already-imported process instead of starting
fresh interpreters that import vLLM again. vLLM itself falls back to spawn when CUDA is initialized
in the parent; its CPU platform always spawns.

``VLLM_SERVER_DEV_MODE`` (the ``/sleep`` and ``/wake_up`` routes a parking start needs) does not pin a
standby: vLLM 0.26 and 0.32 read it when they build the app, after the fork. Their one read at import, the
default of ``--log-error-stack``, the launcher makes explicit on a standby start (``launcher``). Pinned, it
made every start that parks (``hotweights switch``, verify's park drill) refuse the standby a plain start
left, and the next plain start the one it left: on an H200 a switch engine then started plainly, 86 s.
"""

from __future__ import annotations

from ...standby.engine import EngineSpec


def _load_plugins() -> list[str]:
    """vLLM loads its plugins once per process: the server (the standby's child) finds them loaded."""
    try:
        from vllm.plugins import load_general_plugins
    except ImportError:
        return ["vllm.plugins"]
    load_general_plugins()
    return []


SPEC = EngineSpec(
    name="vllm",
    preimports=("torch", "transformers", "vllm", "vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve",
                "vllm.entrypoints.openai.api_server", "vllm.v1.engine.async_llm", "hotweights.engines.vllm.loader"),
    packages=("vllm", "torch", "transformers", "hotweights"),
    env_prefixes=("VLLM_",),
    after_imports=_load_plugins,
    env_after_fork=("VLLM_SERVER_DEV_MODE",),
)
