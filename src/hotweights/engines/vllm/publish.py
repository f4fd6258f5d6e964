"""``python -m hotweights.engines.vllm.publish ARGS``: an engine-layout entry filled without a vLLM start.

``hotweights preload --engine vllm`` used to run a whole vLLM server to fill an entry: its API server, its engine
core, its memory profile, torch.compile, the CUDA graphs, then a stop (120-165 s for an 8B on an H200, four beside
each other). What the entry holds is only what vLLM's loader leaves after ``process_weights_after_loading``. This
runs that and nothing else, in one process: vLLM's config resolved from the same arguments (``EngineArgs``, so the
key is the one a start computes: ``keys.keys_for``), a one-rank model-parallel group, then load format
``hotweights`` with ``publish`` and layout ``engine`` -- the loader of a real start, which loads from disk with
vLLM's ``DefaultModelLoader``, post-processes and writes the tensors through to the keeper. No API server, no KV
cache, no compile, no graphs. The first start after it compiles instead, unless a model with the same config files
compiled before it (``compile_key.py``: vLLM's compile cache keyed by them, not by the path).

One rank only (``--tensor-parallel-size 1``, no pipeline parallelism): a TP start's ranks are processes of their
own, which the whole-server preload drives. ``preload.py`` falls back to it when this exits non-zero.

Prints one JSON line on success: ``{"seconds": ..., "tensors": N}``; exits 2 on arguments it cannot serve.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    began = time.monotonic()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from . import register

    register()  # the load format, the patches (the CPU build's packing shim), as a vLLM process does at start
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="hotweights.engines.vllm.publish"))
    args, server_only = parser.parse_known_args(argv)  # the API server's own flags change no weight
    if server_only:
        print(f"not an engine argument, left to the server: {' '.join(server_only)}", file=sys.stderr)
    engine_args = EngineArgs.from_cli_args(args)
    if engine_args.tensor_parallel_size != 1 or engine_args.pipeline_parallel_size != 1:
        print("publish without a vLLM start serves one rank only (tensor and pipeline parallel size 1)",
              file=sys.stderr)
        return 2
    vllm_config = engine_args.create_engine_config()
    imported = time.monotonic()
    tensors = _load_and_publish(vllm_config)
    print(json.dumps({"seconds": round(time.monotonic() - began, 3), "imports_s": round(imported - began, 3),
                      "tensors": tensors}), flush=True)
    return 0


def _load_and_publish(vllm_config) -> int:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.model_executor.model_loader import get_model_loader

    from ...observe import free_port

    device = torch.device(vllm_config.device_config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    else:  # what vLLM's CPU model runner does before it loads: no accelerator calls in the loaders it inherits
        from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

        _set_torch_accelerator_to_noop()
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                                     backend="nccl" if device.type == "cuda" else "gloo")
        ensure_model_parallel_initialized(1, 1)
        loader = get_model_loader(vllm_config.load_config)
        model = loader.load_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
        count = sum(1 for _ in model.state_dict())
    return count


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
