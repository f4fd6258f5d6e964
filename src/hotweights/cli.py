"""``hotweights`` command line: parse (each ``cli_*`` module registers its subcommands), call. Nothing else.

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
from typing import TYPE_CHECKING

from . import cli_cluster, cli_engine, cli_keeper, cli_switch
from .cli_parser import DTYPES, build_parser, model_option, resolve_model, split_vllm

if TYPE_CHECKING:
    from .cli_parser import Subparsers

logger = logging.getLogger("hotweights")


def main(argv: list[str] | None = None) -> int:
    argv, vllm_args = split_vllm(list(sys.argv[1:] if argv is None else argv))
    tail: list[str] = []
    if vllm_args is None and "--" in argv:  # observe: everything after -- is the server command, options included
        argv, tail = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = build_parser(cli_keeper.register, cli_switch.register, cli_engine.register, cli_cluster.register, register)
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
        return int(args.run(args))
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


def register(sub: Subparsers) -> None:
    """``observe`` and ``verify``, which drive servers as processes."""
    p = sub.add_parser("observe", help="start a server command, time it to /health, write LABEL.log/.json",
                       description="Time-to-ready is measured from process start to the first 200 from the "
                                   "health URL, so it includes up to one poll interval (--interval).")
    p.add_argument("label")
    p.add_argument("cmd", nargs="*", help="-- CMD ARGS... (everything after --)")
    p.add_argument("--health-url", default=None,
                   help="default: http://HOST:PORT/health from the command's --host and --port (127.0.0.1:8000)")
    p.add_argument("--interval", type=float, default=1.0, help="poll interval in seconds (default 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for ready (default 600)")
    p.add_argument("--out", default=".", help="directory for LABEL.log and LABEL.json")
    p.add_argument("--grace", type=float, default=30.0, help="seconds between SIGINT and SIGKILL on the way out")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--then", default=None, help="once ready, run this shell command, then stop the server")
    group.add_argument("--exit-when-ready", action="store_true", help="stop the server as soon as it is ready")
    p.set_defaults(run=cmd_observe)

    p = sub.add_parser("verify", help="run the acceptance procedure and write a report")
    p.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"])
    model_option(p)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
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
    p.add_argument("--no-cold-start", dest="cold", action="store_false",
                   help="skip the disk start with the checkpoint evicted from the page cache (one start less)")
    p.add_argument("--json", action="store_true", help="print the receipts as one JSON line")
    p.set_defaults(run=cmd_verify)
