"""``hotweights`` command line: parse, build the config dataclass, call. Nothing else.

Heavy imports (torch, transformers) happen inside the subcommands that need them, so
``hotweights daemon``, ``status``, ``release`` and ``stop`` start fast and torch-free.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from . import evidence
from .cli_keeper import cmd_daemon, cmd_demote, cmd_parked, cmd_release, cmd_status, cmd_stop
from .cli_parser import build_parser, resolve_model, split_vllm
from .cli_switch import cmd_switch
from .console import emit as _emit

logger = logging.getLogger("hotweights")


def main(argv: list[str] | None = None) -> int:
    argv, vllm_args = split_vllm(list(sys.argv[1:] if argv is None else argv))
    tail: list[str] = []
    if vllm_args is None and "--" in argv:  # observe: everything after -- is the server command, options included
        argv, tail = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_model(parser, args)
    if tail:
        args.cmd = list(getattr(args, "cmd", [])) + tail
    args.vllm_args = vllm_args
    from .unix import die_with_parent

    die_with_parent()  # an engine of `hotweights switch`: gone with its front, however the front goes
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .errors import HotweightsError, missing_extra

    try:
        return COMMANDS[args.command](args)
    except HotweightsError as exc:
        print(f"hotweights {args.command}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"hotweights {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a feature whose extra is not installed
        print(f"hotweights {args.command}: {missing_extra(exc.name or '', args.command)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader left (`... | head`): what it read was what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0
    except OSError as exc:  # a path the user named that cannot be used: one line, no traceback
        where = f"cannot use {exc.filename}: " if exc.filename else ""
        print(f"hotweights {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


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
    from .paths import daemon_paths
    from .parked import front
    from .parked import records as parked

    start = dataclasses.asdict(config) | {"model": os.path.realpath(config.model)}
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    argv = strip(sys.argv[1:], parked.PARK_ON_EXIT, parked.PARK_IDLE_S)
    return front.run_front(daemon_paths(config.attach.socket_dir).directory, "hotweights",
                            parked.start_fingerprint("hotweights", start, ("hotweights", "torch", "transformers")),
                            f"http://{host}:{config.port}", [sys.executable, "-m", "hotweights", *argv],
                            dict(os.environ), args.park_on_exit, args.park_idle_s)


def cmd_observe(args: argparse.Namespace) -> int:
    from .observe import health_url_for, observe

    command = args.cmd
    url = args.health_url or health_url_for(command)
    print(f"hotweights observe: waiting for {url} (up to {args.timeout:.0f} s)", file=sys.stderr, flush=True)
    receipt = observe(args.label, command, out_dir=Path(args.out), health_url=url,
                      timeout_s=args.timeout, interval_s=args.interval, then=args.then,
                      exit_when_ready=args.exit_when_ready, grace_s=args.grace)
    if not receipt.ready:
        print(f"hotweights observe: {receipt.reason}", file=sys.stderr)
    return 0 if receipt.ready else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify.environment import missing_for

    if why := missing_for(args.engine, vllm=not args.engine_cmd):  # first: one line, not ten failed checks
        print(f"hotweights verify: {why}", file=sys.stderr)
        return 1
    from .verify.report import print_verdict
    from .verify.verify import VerifyConfig, verify

    config = VerifyConfig(model=args.model, engine=args.engine, dtype=args.dtype, device=args.device,
                          tp_size=args.tensor_parallel_size, out=args.out, prompt=args.prompt,
                          max_tokens=args.max_tokens, port=args.port, timeout_s=args.timeout,
                          engine_cmd=args.engine_cmd, cold=args.cold)
    code, receipts = verify(config)
    if args.json:
        print(json.dumps(receipts, sort_keys=True))
    else:
        print_verdict(receipts, Path(args.out))
    return code


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
        from .cli_parser import VLLM_HELP

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
        pid = handoff.stop(SPEC, directory)
        _emit(args, {"stopped": pid}, f"stopped the standby (pid {pid})" if pid else "no standby to stop")
        return 0
    state = handoff.status(SPEC, directory)
    text = (f"standby pid {state['pid']} ready (vLLM imported in {state['imports_s']} s); "
            + ("fits this environment" if state["fits"] else f"stale: {'; '.join(state['differs'])}")
            if state["ready"] else f"no standby ready at {state['socket']} ({state.get('reason', '')})")
    _emit(args, state, text)
    return 0 if state["ready"] else 1


COMMANDS = {
    "daemon": cmd_daemon, "preload": cmd_preload, "status": cmd_status, "release": cmd_release, "demote": cmd_demote,
    "stop": cmd_stop, "demo-model": cmd_demo_model, "inspect": cmd_inspect, "generate": cmd_generate,
    "serve": cmd_serve, "parked": cmd_parked, "observe": cmd_observe, "verify": cmd_verify, "vllm": cmd_vllm,
    "standby": cmd_standby, "switch": cmd_switch,
}
