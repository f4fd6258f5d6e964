"""The engine side's subcommands of ``hotweights``: ``preload``, ``demo-model``, ``inspect``, ``serve``,
``generate``, ``vllm``, ``standby``. Heavy imports (torch, transformers, vLLM) happen inside each."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import evidence
from .cli_parser import DTYPES, VLLM_HELP, model_option, park_options, socket_dir_option
from .console import emit as _emit
from .demo_model import SHAPES

if TYPE_CHECKING:
    from .cli_parser import Subparsers

logger = logging.getLogger("hotweights")


def _extra_config(args: argparse.Namespace) -> dict[str, Any]:
    try:
        extra = json.loads(args.model_loader_extra_config)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--model-loader-extra-config is not valid JSON ({exc}): "
                         f"{args.model_loader_extra_config!r}; e.g. '{{\"fallback\": false}}'") from None
    if not isinstance(extra, dict):
        raise ValueError("--model-loader-extra-config must be a JSON object, e.g. '{\"fallback\": false}'")
    return extra


def cmd_preload(args: argparse.Namespace) -> int:
    from .loading.checkpoint import check_config_dir, open_checkpoint

    open_checkpoint(args.model)  # its weight files first (headers only): what they lack says more
    check_config_dir(Path(args.model))  # else its weights are published under a model nothing can serve
    if args.engine == "vllm":
        return _preload_vllm(args)
    if args.vllm_arg or args.vllm_python or args.log:
        raise ValueError("--vllm-arg, --vllm-python and --log apply to --engine vllm only")
    from .console import ProgressBar
    from .loading.headroom import lower_priority_for_the_oom_killer
    from .loading.preload import preload

    lower_priority_for_the_oom_killer()  # under pressure this loader goes before the daemon or an engine

    with ProgressBar(enabled=sys.stderr.isatty() and not args.json) as progress:
        result = preload(args.model, dtype=args.dtype, device=args.device, tp_size=args.tensor_parallel_size,
                         pool_bytes=args.pool_mib << 20, socket_dir=args.socket_dir, progress=progress)
    key = result.key
    line = (f"Already cached: {key.model} [{key.short}] on {key.device}" if result.already_cached else
            evidence.published(result.num_tensors, result.nbytes, key.model, key.short, key.device, result.seconds)
            + f" ({result.nbytes / max(result.seconds, 1e-9) / evidence.GIB:.2f} GiB/s)")
    _emit(args, {"key": key.short, "model": key.model, "dtype": key.dtype, "device": key.device,
                 "num_tensors": result.num_tensors, "nbytes": result.nbytes, "seconds": result.seconds,
                 "gbps": result.gbps, "already_cached": result.already_cached,
                 "socket": str(result.socket_path)}, line)
    return 0


def _preload_vllm(args: argparse.Namespace) -> int:
    from .engines.vllm.preload import preload_vllm

    if args.device != "cpu":
        raise ValueError("--device does not apply to --engine vllm: vLLM loads on the device its build runs on "
                         "(pass vLLM's own flags with --vllm-arg)")
    result = preload_vllm(args.model, dtype=args.dtype, tp_size=args.tensor_parallel_size,
                          socket_dir=args.socket_dir, python=args.vllm_python, extra_args=args.vllm_arg,
                          log_path=args.log)
    lines = [f"Published {r['num_tensors']} tensors ({r['gib']:.2f} GiB) to weight cache: {r['model']} "
             f"[{r['key']}] on {r['device']} (layout vllm)" for r in result.published]
    lines += [f"Already cached (engine layout), {result.already_cached} rank(s)"] if result.already_cached else []
    standby = {"prepared": "a warm standby is importing vLLM for it", "ready": "a warm standby is there for it",
               "off": "no standby (HOTWEIGHTS_VLLM_STANDBY=off)",
               "failed": "no warm standby could be started (the warning above says why)"}[result.standby]
    _emit(args, {"engine": "vllm", "published": result.published, "already_cached": result.already_cached,
                 "seconds": result.seconds, "log": result.log, "started_up": result.started_up,
                 "standby": result.standby},
          "\n".join(lines + [f"vLLM run: {result.seconds:.1f} s, log {result.log}",
                              f"The next `hotweights vllm serve` of this model starts from the cache; {standby}"]))
    return 0


def cmd_demo_model(args: argparse.Namespace) -> int:
    from .demo_model import write_demo_model

    try:
        out = write_demo_model(args.directory, args.size, gen_device=args.gen_device, seed=args.seed,
                               link_shards_from=args.link_shards_from)
    except (ValueError, OSError) as exc:
        print(f"hotweights demo-model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.size} demo model to {out}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .loading.checkpoint import checkpoint_key, open_checkpoint

    ckpt = open_checkpoint(args.model)
    dtype = ckpt.resolve_dtype(args.dtype)
    key = checkpoint_key(ckpt, dtype=dtype)
    _emit(args, {"model": key.model, "arch": key.arch, "dtype": dtype, "key": key.short,
                 "shards": [s.content_digest for s in key.shards]},
          f"{key.model}: {key.arch} {dtype} key {key.short} ({len(key.shards)} shards)")
    return 0


def _model_dir(path: str) -> str:
    """A local model directory, or one line saying it is not one (no hub, no network)."""
    from .errors import CheckpointError
    from .loading.checkpoint import check_model_dir

    if not Path(path).is_dir():
        raise CheckpointError(f"model directory {path} does not exist; models are local directories "
                              f"(download the model first)")
    check_model_dir(path)
    return path


def cmd_serve(args: argparse.Namespace) -> int:
    from .config import AttachConfig
    from .loading.checkpoint import check_tokenizer_dir
    from .serve.config import ServeConfig

    check_tokenizer_dir(_model_dir(args.model))  # else it would serve, and answer every request with a 500
    config = ServeConfig(model=args.model, host=args.host, port=args.port, dtype=args.dtype,
                         device=args.device, served_model_name=args.served_model_name,
                         max_model_len=args.max_model_len, load_format=args.load_format, model_impl=args.model_impl,
                         access_log=not args.disable_uvicorn_access_log,
                         attach=AttachConfig.from_dict(_extra_config(args)))
    if not args.park_on_exit:
        from .serve.app import run

        return run(config)
    import dataclasses

    from .argv import strip
    from .observe import client_host
    from .paths import daemon_paths
    from .parked import front
    from .parked import records as parked

    start = dataclasses.asdict(config) | {"model": os.path.realpath(config.model)}
    host = client_host(config.host)
    argv = strip(sys.argv[1:], parked.PARK_ON_EXIT, parked.PARK_IDLE_S)
    return front.run_front(daemon_paths(config.attach.socket_dir).directory, "hotweights",
                            parked.start_fingerprint("hotweights", start, ("hotweights", "torch", "transformers")),
                            f"http://{host}:{config.port}", [sys.executable, "-m", "hotweights", *argv],
                            dict(os.environ), args.park_on_exit, args.park_idle_s)


def cmd_generate(args: argparse.Namespace) -> int:
    model, config = _model_dir(args.model), _extra_config(args)  # said at once, before torch is imported
    from .engines.transformers import generate

    result = generate(model, args.prompt, max_tokens=args.max_tokens, dtype=args.dtype,
                      device=args.device, config=config, load_format=args.load_format)
    report = result.report
    _emit(args, {"source": report.source, "weights_s": report.weights_s, "build_s": report.build_s,
                 "total_s": result.total_s, "key": report.key_short, "completion": result.text,
                 "token_ids": result.token_ids},
          f"[{report.source}] weights in {report.weights_s * 1e3:.1f} ms: {result.text!r}")
    return 0


def cmd_vllm(args: argparse.Namespace) -> int:
    if args.vllm_args in ([], ["-h"], ["--help"]):  # hotweights' part; vLLM's own: hotweights vllm serve --help

        print(VLLM_HELP)
        return 0
    from .engines.vllm.start import VllmStart, preload_instead

    if args.vllm_args[0] == "preload":  # vLLM 0.32's own weight cache: say what does it here
        print(preload_instead(args.vllm_args[1:]), file=sys.stderr)
        return 2
    from .engines.vllm import launcher, preflight

    from .argv import strip
    from .parked.records import PARK_IDLE_S, PARK_ON_EXIT

    argv = strip(args.vllm_args, PARK_ON_EXIT, PARK_IDLE_S)  # hotweights' own flags
    park = int(PARK_ON_EXIT.value(args.vllm_args, "1") or 0)
    idle_s = float(PARK_IDLE_S.value(args.vllm_args, "3600") or 3600)
    start = VllmStart.parse(argv)  # once, for the preflight, the launcher and the standby
    preflight.check(start)  # a strict start the daemon cannot serve exits 1 here, with the strict message
    return launcher.run(start, park=park, park_idle_s=idle_s)


def cmd_standby(args: argparse.Namespace) -> int:
    from .engines.vllm.standby import SPEC
    from .paths import resolve_socket_dir
    from .standby import handoff

    directory = resolve_socket_dir(args.socket_dir)
    if args.stop:
        pids = handoff.stop(SPEC, directory)
        _emit(args, {"stopped": pids}, f"stopped {len(pids)} standby(s) (pid {', '.join(map(str, pids))})" if pids
              else "no standby to stop")
        return 0
    state = handoff.status(SPEC, directory)
    state["others"] = handoff.others(SPEC, directory)
    text = (f"standby pid {state['pid']} ready (vLLM imported in {state['imports_s']} s); "
            + ("fits this environment" if state["fits"] else f"stale: {'; '.join(state['differs'])}")
            if state["ready"] else f"no standby ready at {state['socket']} ({state.get('reason', '')})")
    text += "".join(f"\nstandby pid {o['pid']} in place {o['place']}: {o['doing']}" for o in state["others"])
    _emit(args, state, text)
    return 0 if state["ready"] else 1


def register(sub: Subparsers) -> None:
    """The engine side's subcommands: preload, serve, generate, ..."""
    p = sub.add_parser("preload", help="load a checkpoint into the cache (starts the daemon if needed)")
    model_option(p)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pool-mib", type=int, default=1024, help="size cap of one pool in MiB")
    p.add_argument("--engine", choices=["checkpoint", "vllm"], default="checkpoint",
                   help="checkpoint: the checkpoint's tensors, no engine in the loop; vllm: run vLLM's own "
                        "loader (a vLLM server started with --load-format hotweights and publish) and publish the "
                        "engine layout, one entry per TP rank, on the device vLLM runs on")
    # %(default).0s prints nothing: the formatter adds no "(default: None)" after a default told in words
    p.add_argument("--vllm-python", help="python that has vLLM (default: $HOTWEIGHTS_VLLM_PYTHON, else this one)"
                                         "%(default).0s")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for vLLM, repeatable (e.g. --vllm-arg=--max-model-len=4096)%(default).0s")
    p.add_argument("--log", type=Path, help="with --engine vllm: where to keep vLLM's log")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    socket_dir_option(p)
    p.set_defaults(run=cmd_preload)

    p = sub.add_parser("demo-model", help="write a deterministic Qwen3-architecture demo checkpoint")
    p.add_argument("directory")
    p.add_argument("--size", default="tiny", choices=list(SHAPES))
    p.add_argument("--gen-device", default="cpu", help="where random weights are drawn (cuda is faster for 8b)")
    p.add_argument("--seed", type=int, default=0, help="another model of the same shape with other bytes (several "
                                                       "models for hotweights switch)")
    p.add_argument("--link-shards-from", default=None, metavar="DIR",
                   help="a demo model of this size written whole: every shard but the last is a hard link to its "
                        "file, the last is drawn with --seed (ten 8B models in 53 GB of disk, not 164)")
    p.set_defaults(run=cmd_demo_model)

    p = sub.add_parser("inspect", help="a checkpoint's cache key: arch, dtype, digests (reads no daemon)")
    model_option(p)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_inspect)

    p = sub.add_parser("vllm", description=VLLM_HELP,
                       help="start vLLM with ARGS (hotweights vllm serve MODEL ...), a strict start checked first")
    p.set_defaults(run=cmd_vllm)

    p = sub.add_parser("standby", help="the warm vLLM standby of this interpreter: is it ready, does it fit",
                       description="hotweights vllm serve starts from a warm standby (vLLM imported) when one fits, "
                                   "and prepares one for the next start; HOTWEIGHTS_VLLM_STANDBY=off turns that off, "
                                   "HOTWEIGHTS_STANDBYS=N keeps up to N (one per start at once)")
    socket_dir_option(p)
    p.add_argument("--stop", action="store_true", help="retire them (also those still importing vLLM)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_standby)
    _serving(sub)


def _serving(sub: Subparsers) -> None:
    """``serve`` and ``generate``: a model loaded in this process."""
    p = sub.add_parser("serve", help="OpenAI-compatible server loading through the cache",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; taken before the model loads")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weight dtype (auto: the checkpoint's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--served-model-name", default=None, help="model name in the API (default: the path)%(default).0s")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)%(default).0s")
    p.add_argument("--load-format", default="hotweights", choices=["hotweights", "auto"],
                   help="hotweights: through the cache (with the fallback on by default); auto: from disk")
    p.add_argument("--model-impl", default="auto", choices=["auto", "native", "transformers"],
                   help="auto: hotweights' plain-torch decoder where it covers the model (llama, mistral, qwen2, "
                        "qwen3; fast start), else transformers; transformers: always transformers")
    p.add_argument("--model-loader-extra-config", default="{}",
                   help="JSON: mode, fallback, socket_dir, socket_path, connect_timeout_s, state_timeout_s, "
                        "publish, rehash")
    p.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="no line per request (vLLM's flag of the same name)")
    park_options(p)
    p.set_defaults(run=cmd_serve)

    p = sub.add_parser("generate", help="load a model (cache or disk) with transformers and complete a prompt")
    model_option(p)
    p.add_argument("--prompt", default="The weight cache says")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--load-format", default="hotweights", choices=["hotweights", "auto"])
    p.add_argument("--model-loader-extra-config", default="{}", help="JSON: mode, fallback, socket_dir, ...")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_generate)
