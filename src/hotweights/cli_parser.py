"""The ``hotweights`` argument parser: the options several subcommands share, and ``build_parser``, which asks each
``cli_*`` module to register its own subcommands (each with ``run``, the function that runs it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

DTYPES = ["auto", "float16", "bfloat16", "float32"]
MODEL_COMMANDS = {"preload", "inspect", "serve", "verify", "generate"}


def awake_count(text: str) -> int | str:
    """``--max-awake``: auto or a count (the switch's config checks its bounds)."""
    return text if text == "auto" else int(text)


def socket_dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket-dir", default=None,
                   help="daemon directory (default: $HOTWEIGHTS_SOCKET_DIR, $XDG_RUNTIME_DIR/hotweights, "
                        "/tmp/hotweights-<uid>)")


def model_option(p: argparse.ArgumentParser) -> None:
    # like `vllm serve`: the model directory as the first argument or as --model
    p.add_argument("model_pos", nargs="?", metavar="MODEL", default=argparse.SUPPRESS,
                   help="local model directory (safetensors); required, here or as --model")
    p.add_argument("--model", dest="model_opt", metavar="MODEL", default=argparse.SUPPRESS,
                   help="the same, as an option")


def park_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--park-on-exit", type=int, nargs="?", const=1, default=None, choices=[1, 2], metavar="LEVEL",
                   help="Ctrl-C/SIGTERM parks the server (level 1: weights kept mapped; 2: unmapped) instead of "
                        "stopping it, and the next run of the same start wakes it (`hotweights parked`); off without it"
                        "%(default).0s")
    p.add_argument("--park-idle-s", type=float, default=3600.0,
                   help="with --park-on-exit: a parked server retires after this long, or when the keeper no longer "
                        "holds its weights")


def resolve_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.model`` from MODEL or --model MODEL (one of them, or both the same)."""
    if args.command not in MODEL_COMMANDS:
        return
    given = {m for m in (getattr(args, "model_pos", None), getattr(args, "model_opt", None)) if m}
    if len(given) != 1:
        parser.error("give the model directory once: MODEL or --model MODEL" if given else
                     "a model directory is required: MODEL or --model MODEL")
    args.model = given.pop()


VLLM_HELP = """\
usage: hotweights vllm ARGS...   (e.g. hotweights vllm serve MODEL --load-format hotweights ...)

Runs vLLM's own CLI with ARGS in this interpreter, every argument passed on untouched, with:
  - a strict start (--load-format hotweights, {"fallback": false}) that the daemon cannot serve (no daemon, an
    untrusted one, no entry of the model) fails first, with the strict message, in well under a second;
  - serve starts from a warm standby (vLLM already imported) when one fits, and prepares one for the next start
    (hotweights standby; HOTWEIGHTS_VLLM_STANDBY=off turns it off).

hotweights' own flags, taken out of ARGS:
  --park-on-exit [1|2]   Ctrl-C parks the server (vLLM's sleep mode; level 2 also unmaps the weights) and the
                         next run of the same start wakes it in about a second (hotweights parked lists them)
  --park-idle-s S        a parked server retires after S seconds (3600), or when its weights are released

vLLM's own options: hotweights vllm serve --help."""


def split_vllm(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``[--global-options] vllm ARGS...`` -> (what argparse parses, ARGS); ARGS is None for other
    commands. vLLM's arguments bypass argparse, which cannot take a remainder that starts with an option."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] or argv[i] in ("-h", "--help", "--version") else 2
    if i < len(argv) and argv[i] == "vllm":
        return argv[:i + 1], argv[i + 1:]
    return argv, None


def byte_size(text: str) -> int:
    """``8G``, ``512M``, ``1.5T``, ``8GiB`` or plain bytes -> bytes (binary units: ``G`` is GiB)."""
    units = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
    number = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = number[-1:] if number[-1:] in units else ""
    try:
        value = float(number[:len(number) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: bytes, or a number with K, M, G or T (8G)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size cannot be negative")
    return int(value * (1 << units[unit]))


def build_parser(*registers: Callable[[Subparsers], None]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotweights", description="Keep LLM weights resident across restarts.")
    parser.add_argument("--version", action="version", version=f"hotweights {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)
    for register in registers:
        register(sub)
    for command in sub.choices.values():  # every --help shows each option's default
        for action in command._actions:
            if (action.option_strings and not any(action.default is x for x in (None, False, True, argparse.SUPPRESS))
                    and "%(default)" not in (action.help or "")
                    and command.formatter_class is not argparse.ArgumentDefaultsHelpFormatter):
                action.help = f"{action.help or ''} (default: %(default)s)".strip()
    return parser
