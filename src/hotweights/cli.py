"""``hotweights`` command line: parse, build the config dataclass, call. Nothing else.

Heavy imports (torch, transformers) happen inside the subcommands that need them, so
``hotweights daemon``, ``status``, ``release`` and ``stop`` start fast and torch-free.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from . import __version__, evidence

logger = logging.getLogger("hotweights")


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _socket_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket-dir", default=None,
                   help="daemon directory (default: $HOTWEIGHTS_SOCKET_DIR, $XDG_RUNTIME_DIR/hotweights, "
                        "/tmp/hotweights-<uid>)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotweights", description="Keep LLM weights resident across restarts.")
    parser.add_argument("--version", action="version", version=f"hotweights {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("daemon", help="run the keeper daemon in the foreground")
    _socket_dir(p)
    p.add_argument("--max-bytes", type=int, default=0, help="refuse publishes beyond this many bytes (0: no cap)")
    p.add_argument("--detach", action="store_true",
                   help="double-fork into the background (no longer a descendant of the caller, so an engine "
                        "that kills its process tree on exit does not take the daemon with it)")

    p = sub.add_parser("preload", help="load a checkpoint into the cache (starts the daemon if needed)")
    p.add_argument("--model", required=True, help="checkpoint directory (safetensors)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pool-mib", type=int, default=1024, help="size cap of one pool in MiB (default 1024)")
    p.add_argument("--engine", choices=["checkpoint", "vllm"], default="checkpoint",
                   help="checkpoint (default): the checkpoint's tensors, no engine in the loop; vllm: run vLLM's own "
                        "loader (a vLLM server started with --load-format hotweights and publish) and publish the "
                        "engine layout, one entry per TP rank, on the device vLLM runs on")
    p.add_argument("--vllm-python", help="python that has vLLM (default $HOTWEIGHTS_VLLM_PYTHON, else this one)")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for vLLM, repeatable (e.g. --vllm-arg=--max-model-len=4096)")
    p.add_argument("--log", type=Path, help="with --engine vllm: where to keep vLLM's log")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    _socket_dir(p)

    p = sub.add_parser("status", help="what the daemon holds")
    p.add_argument("--json", action="store_true")
    _socket_dir(p)

    p = sub.add_parser("release", help="drop an entry (engines that attached keep their mapping)")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("key", nargs="?", help="short key from `hotweights status`")
    group.add_argument("--all", action="store_true")
    p.add_argument("--json", action="store_true")
    _socket_dir(p)

    p = sub.add_parser("stop", help="stop the daemon (engines that attached keep their weights)")
    _socket_dir(p)

    p = sub.add_parser("demo-model", help="write a deterministic Qwen3-architecture demo checkpoint")
    p.add_argument("directory")
    p.add_argument("--size", default="tiny", choices=["tiny", "small", "1g", "0.6b", "8b"])
    p.add_argument("--gen-device", default="cpu", help="where random weights are drawn (cuda is faster for 8b)")

    p = sub.add_parser("serve", help="OpenAI-compatible server (transformers) loading through the cache")
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--load-format", default="hotweights", choices=["hotweights", "auto"])
    p.add_argument("--model-loader-extra-config", default="{}",
                   help="JSON: mode, fallback, socket_dir, socket_path, connect_timeout_s, state_timeout_s, publish")

    p = sub.add_parser("observe", help="start a server command, time it to /health, write LABEL.log/.json",
                       description="Time-to-ready is measured from process start to the first 200 from the "
                                   "health URL, so it includes up to one poll interval (--interval).")
    p.add_argument("label")
    p.add_argument("cmd", nargs="*", help="-- CMD ARGS... (everything after --)")
    p.add_argument("--health-url", default="http://127.0.0.1:8000/health")
    p.add_argument("--interval", type=float, default=1.0, help="poll interval in seconds (default 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for ready (default 600)")
    p.add_argument("--out", default=".", help="directory for LABEL.log and LABEL.json")
    p.add_argument("--grace", type=float, default=30.0, help="seconds between SIGINT and SIGKILL on the way out")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--then", default=None, help="once ready, run this shell command, then stop the server")
    group.add_argument("--exit-when-ready", action="store_true", help="stop the server as soon as it is ready")

    p = sub.add_parser("verify", help="run the acceptance procedure and write a report")
    p.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"])
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--out", default="hotweights-verify")
    p.add_argument("--prompt", default="The weight cache")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each server may take to be ready")
    p.add_argument("--engine-cmd", default=None,
                   help="server command template with {python} {model} {port} {dtype} {device} {tp} "
                        "{load_format} {extra} (default: the --engine's own)")
    p.add_argument("--json", action="store_true", help="print the receipts as one JSON line")

    p = sub.add_parser("generate", help="load a model (cache or disk) with transformers and complete a prompt")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt", default="The weight cache says")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--load-format", default="hotweights", choices=["hotweights", "auto"])
    p.add_argument("--model-loader-extra-config", default="{}", help="JSON: mode, fallback, socket_dir, ...")
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in argv:  # observe: everything after -- is the server command, options included
        argv, tail = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    if tail:
        args.cmd = list(getattr(args, "cmd", [])) + tail
    _configure_logging(args.log_level)
    from .errors import HotweightsError

    try:
        return COMMANDS[args.command](args)
    except HotweightsError as exc:
        print(f"hotweights {args.command}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"hotweights {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, sort_keys=True) if getattr(args, "json", False) else text, flush=True)


def cmd_daemon(args: argparse.Namespace) -> int:
    from .daemon import DaemonAlreadyRunning, DaemonConfig, run
    from .paths import daemon_paths

    import os

    if args.detach:
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
    try:
        return run(DaemonConfig(daemon_paths(args.socket_dir), max_bytes=args.max_bytes))
    except DaemonAlreadyRunning as exc:
        print(f"hotweights daemon: {exc}", file=sys.stderr)
        return 3


def cmd_preload(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return _preload_vllm(args)
    if args.vllm_arg or args.vllm_python or args.log:
        raise ValueError("--vllm-arg, --vllm-python and --log apply to --engine vllm only")
    from .loading.preload import preload

    with _progress_bar(enabled=sys.stderr.isatty() and not args.json) as progress:
        result = preload(args.model, dtype=args.dtype, device=args.device, tp_size=args.tensor_parallel_size,
                         pool_bytes=args.pool_mib << 20, socket_dir=args.socket_dir, progress=progress)
    key = result.key
    line = (f"Already cached: {key.model} [{key.short}] on {key.device}" if result.already_cached else
            evidence.published(result.num_tensors, result.nbytes, key.model, key.short, key.device, result.seconds)
            + f" ({result.gbps:.2f} GB/s)")
    _emit(args, {"key": key.short, "model": key.model, "dtype": key.dtype, "device": key.device,
                 "num_tensors": result.num_tensors, "nbytes": result.nbytes, "seconds": result.seconds,
                 "gbps": result.gbps, "already_cached": result.already_cached,
                 "socket": str(result.socket_path)}, line)
    return 0


def _preload_vllm(args: argparse.Namespace) -> int:
    from .engines.vllm_preload import preload_vllm

    if args.device != "cpu":
        raise ValueError("--device does not apply to --engine vllm: vLLM loads on the device its build runs on "
                         "(pass vLLM's own flags with --vllm-arg)")
    result = preload_vllm(args.model, dtype=args.dtype, tp_size=args.tensor_parallel_size,
                          socket_dir=args.socket_dir, python=args.vllm_python, extra_args=args.vllm_arg,
                          log_path=args.log)
    lines = [f"Published {r['num_tensors']} tensors ({r['gib']:.2f} GiB) to weight cache: {r['model']} "
             f"[{r['key']}] on {r['device']} (layout vllm)" for r in result.published]
    lines += [f"Already cached (engine layout), {result.already_cached} rank(s)"] if result.already_cached else []
    _emit(args, {"engine": "vllm", "published": result.published, "already_cached": result.already_cached,
                 "seconds": result.seconds, "log": result.log},
          "\n".join(lines + [f"vLLM run: {result.seconds:.1f} s, log {result.log}"]))
    return 0


class _progress_bar:
    """A rich progress bar with throughput when stderr is a terminal; a no-op otherwise."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import (BarColumn, DownloadColumn, Progress, TimeRemainingColumn,
                                   TransferSpeedColumn)

        self._progress = Progress("[bold]preload", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                  TimeRemainingColumn(), transient=True)
        self._progress.start()
        self._task = self._progress.add_task("preload", total=None)
        return self.update

    def update(self, done: int, total: int) -> None:
        self._progress.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def cmd_status(args: argparse.Namespace) -> int:
    from .client import connect
    from .paths import daemon_paths

    with connect(daemon_paths(args.socket_dir)) as client:
        status = client.status()
    data = {"pid": status.pid, "version": status.daemon_version, "uptime_s": round(status.uptime_s, 1),
            "entries": status.entries, "bytes_by_device": status.bytes_by_device,
            "torch_imported": status.torch_imported, "socket": str(client.socket_path)}
    lines = [f"daemon pid={status.pid} version={status.daemon_version} uptime={status.uptime_s:.0f}s "
             f"socket={client.socket_path}"]
    for dev, nbytes in sorted(status.bytes_by_device.items()):
        lines.append(f"  {dev}: {nbytes / 2**30:.2f} GiB")
    lines.append(f"{'KEY':<14}{'MODEL':<20}{'LAYOUT':<14}{'TP':<5}{'DTYPE':<10}{'DEVICE':<16}{'GiB':>8}"
                 f"{'TENSORS':>9}{'ATTACHES':>10}")
    for e in status.entries:
        lines.append(f"{e['key']:<14}{e['model'][:19]:<20}{e['layout'][:13]:<14}{e['tp']:<5}{e['dtype']:<10}"
                     f"{e['device'][:15]:<16}{e['nbytes'] / 2**30:>8.2f}{e['num_tensors']:>9}{e['num_attaches']:>10}")
    if not status.entries:
        lines.append("(no entries)")
    _emit(args, data, "\n".join(lines))
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from .client import connect
    from .paths import daemon_paths

    with connect(daemon_paths(args.socket_dir)) as client:
        released = client.release(None if args.all else args.key).released
    _emit(args, {"released": released}, f"released {len(released)} entries: {' '.join(released) or '-'}")
    return 0 if released or args.all else 1


def cmd_stop(args: argparse.Namespace) -> int:
    from .client import connect
    from .paths import daemon_paths

    with connect(daemon_paths(args.socket_dir)) as client:
        client.stop()
    print("daemon stopped")
    return 0


def cmd_demo_model(args: argparse.Namespace) -> int:
    from .demo_model import write_demo_model

    out = write_demo_model(args.directory, args.size, gen_device=args.gen_device)
    print(f"wrote {args.size} demo model to {out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .config import AttachConfig
    from .serve.app import ServeConfig, run

    extra = json.loads(args.model_loader_extra_config)
    if not isinstance(extra, dict):
        raise ValueError("--model-loader-extra-config must be a JSON object")
    return run(ServeConfig(model=args.model, host=args.host, port=args.port, dtype=args.dtype, device=args.device,
                           served_model_name=args.served_model_name, max_model_len=args.max_model_len,
                           load_format=args.load_format, attach=AttachConfig.from_dict(extra)))


def cmd_observe(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .verify.observe import observe

    command = args.cmd
    receipt = observe(args.label, command, out_dir=Path(args.out), health_url=args.health_url,
                      timeout_s=args.timeout, interval_s=args.interval, then=args.then,
                      exit_when_ready=args.exit_when_ready, grace_s=args.grace)
    return 0 if receipt.ready else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .verify.report import print_verdict
    from .verify.verify import VerifyConfig, verify

    config = VerifyConfig(model=args.model, engine=args.engine, dtype=args.dtype, device=args.device,
                          tp_size=args.tensor_parallel_size, out=args.out, prompt=args.prompt,
                          max_tokens=args.max_tokens, port=args.port, timeout_s=args.timeout,
                          engine_cmd=args.engine_cmd)
    code, receipts = verify(config)
    if args.json:
        print(json.dumps(receipts, sort_keys=True))
    else:
        print_verdict(receipts, Path(args.out))
    return code


def cmd_generate(args: argparse.Namespace) -> int:
    import time

    import torch

    from .engines.transformers import load_model

    start = time.perf_counter()
    model, report = load_model(args.model, dtype=args.dtype, device=args.device,
                               config=json.loads(args.model_loader_extra_config), load_format=args.load_format)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(model.device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=args.max_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    data = {"source": report.source, "weights_s": report.weights_s, "build_s": report.build_s,
            "total_s": time.perf_counter() - start, "key": report.key_short, "completion": text,
            "token_ids": out[0, ids.shape[1]:].tolist()}
    _emit(args, data, f"[{report.source}] weights in {report.weights_s * 1e3:.1f} ms: {text!r}")
    return 0


COMMANDS = {
    "daemon": cmd_daemon, "preload": cmd_preload, "status": cmd_status, "release": cmd_release,
    "stop": cmd_stop, "demo-model": cmd_demo_model, "generate": cmd_generate, "serve": cmd_serve,
    "observe": cmd_observe, "verify": cmd_verify,
}
