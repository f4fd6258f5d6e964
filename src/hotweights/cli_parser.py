"""The ``hotweights`` argument parser: every subcommand, flag, default and help text."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import __version__
from .demo_model import SHAPES

DTYPES = ["auto", "float16", "bfloat16", "float32"]
MODEL_COMMANDS = {"preload", "inspect", "serve", "verify", "generate"}


def _awake(text: str) -> int | str:
    """``--max-awake``: auto or a count (the switch's config checks its bounds)."""
    return text if text == "auto" else int(text)


def _socket_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket-dir", default=None,
                   help="daemon directory (default: $HOTWEIGHTS_SOCKET_DIR, $XDG_RUNTIME_DIR/hotweights, "
                        "/tmp/hotweights-<uid>)")


def _model(p: argparse.ArgumentParser) -> None:
    # like `vllm serve`: the model directory as the first argument or as --model
    p.add_argument("model_pos", nargs="?", metavar="MODEL", default=argparse.SUPPRESS,
                   help="local model directory (safetensors); required, here or as --model")
    p.add_argument("--model", dest="model_opt", metavar="MODEL", default=argparse.SUPPRESS,
                   help="the same, as an option")


def _park_flags(p: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915
    parser = argparse.ArgumentParser(prog="hotweights", description="Keep LLM weights resident across restarts.")
    parser.add_argument("--version", action="version", version=f"hotweights {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("daemon", help="run the keeper daemon in the foreground")
    _socket_dir(p)
    p.add_argument("--max-bytes", type=byte_size, default=None,
                   help="refuse publishes beyond this size: bytes, or with K, M, G, T (binary: 8G = 8 GiB); 0: no cap "
                        "(default: 0; with --replace: the running daemon's)")
    p.add_argument("--detach", action="store_true",
                   help="double-fork into the background (no longer a descendant of the caller, so an engine "
                        "that kills its process tree on exit does not take the daemon with it)")
    p.add_argument("--init", action="store_true",
                   help="a container's PID 1: run the daemon as a child and stay while a daemon holds its lock, so "
                        "`kubectl exec POD -- hotweights daemon --replace --detach` upgrades it in place")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (GET /metrics); 0: none "
                        "(default: 0; with --replace: the running daemon's)")
    p.add_argument("--metrics-host", default=None,
                   help="address of the metrics endpoint (default: 127.0.0.1; with --replace: the running daemon's)")
    p.add_argument("--replace", action="store_true",
                   help="take every entry (its pool fds), the settings not given here and then the place of the "
                        "running daemon, which exits: an upgrade or a restart without losing the cache; attaches go "
                        "on meanwhile. Under systemd: the unit restarts with its fd store instead")

    p = sub.add_parser("preload", help="load a checkpoint into the cache (starts the daemon if needed)")
    _model(p)
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

    p = sub.add_parser("switch", help="many models behind one port: a request's model wakes its engine, the others "
                                      "park (--config FILE, or --model NAME=DIR ... [-- ENGINE ARGS])")
    p.add_argument("action", nargs="?", default="serve", choices=["serve", "status", "park", "stop", "start"],
                   help="serve (default); status: each model's state, from a running switch; park, stop or start "
                        "NAME: that model's engine, in a running switch")
    p.add_argument("target", nargs="?", default=None, help="park/stop/start: the model (its name or an alias)")
    p.add_argument("--config", default=None, help="TOML file: [switch] and one [[model]] table per model "
                                                  "(docs/switch.md has a complete example)")
    p.add_argument("--model", dest="models", action="append", default=[], metavar="NAME=DIR",
                   help="the quick form: a model and its checkpoint (repeat; the first is the default)")
    p.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"], help="the quick form's engine")
    p.add_argument("--host", default=None, help="address of the front (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port of the front (default 8000)")
    p.add_argument("--max-awake", type=_awake, default=None,
                   help="engines awake at once per GPU: auto (default: as many as GPU memory holds) or a cap")
    p.add_argument("--request-timeout-s", type=float, default=None,
                   help="how long a request waits for its model before a 503 (default 300)")
    p.add_argument("--api-key", default=None, help="Bearer key the front asks for on /v1 (default: $VLLM_API_KEY; "
                                                   "status sends it)")
    p.add_argument("--log-dir", default=None, help="where each engine's log goes (default: a new temporary directory)")
    p.add_argument("--no-parking", action="store_true",
                   help="a switch stops the engine and starts the next one instead of parking it (for comparison)")
    p.add_argument("--parked-weights", choices=["gpu", "host"], default=None,
                   help="the quick form: where a parked engine's weights stay (host: off the GPU, so more models fit; "
                        "a wake uploads them)")
    p.add_argument("--stop-keeper", action="store_true",
                   help="on the way out, stop the keeper if this front started it (else it keeps the weights for the "
                        "next start)")
    p.add_argument("--schedule", choices=["fair", "fifo"], default=None,
                   help="which waiting model a switch serves next: fair (default: the most requests waiting; one "
                        "waiting over starve_after_s first) or fifo (first come)")
    p.add_argument("--turn-s", type=float, default=None,
                   help="where memory forces a choice between busy engines, a busy one leaves once another model's "
                        "waiting requests have waited this long in sum per request in flight on it (default 1)")
    p.add_argument("--preload-jobs", type=int, default=None,
                   help="start-up's preloads at once, where GPU memory allows (default 0: 4 with GPUs, else 1)")
    p.add_argument("--json", action="store_true", help="status: one JSON object")

    p = sub.add_parser("parked", help="the parked engines of this user (--park-on-exit): list, wake, retire")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--wake", type=int, metavar="PID", help="wake it where it is (it serves on, in the background)")
    group.add_argument("--retire", metavar="PID|all", help="stop it (or all of them) and free what it holds")
    p.add_argument("--json", action="store_true")
    _socket_dir(p)

    p = sub.add_parser("demote", help="move an entry to host memory (a host copy; deep-parked engines wake from it)")
    p.add_argument("key", help="short key (or a unique prefix) from `hotweights status`")
    p.add_argument("--keep", action="store_true", help="keep the device copy too (make the host copy only)")
    p.add_argument("--json", action="store_true")
    _socket_dir(p)

    p = sub.add_parser("stop", help="stop the daemon (engines that attached keep their weights)")
    _socket_dir(p)

    p = sub.add_parser("demo-model", help="write a deterministic Qwen3-architecture demo checkpoint")
    p.add_argument("directory")
    p.add_argument("--size", default="tiny", choices=list(SHAPES))
    p.add_argument("--gen-device", default="cpu", help="where random weights are drawn (cuda is faster for 8b)")
    p.add_argument("--seed", type=int, default=0, help="another model of the same shape with other bytes (several "
                                                       "models for hotweights switch)")
    p.add_argument("--link-shards-from", default=None, metavar="DIR",
                   help="a demo model of this size written whole: every shard but the last is a hard link to its "
                        "file, the last is drawn with --seed (ten 8B models in 53 GB of disk, not 164)")

    p = sub.add_parser("inspect", help="a checkpoint's cache key: arch, dtype, digests (reads no daemon)")
    _model(p)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("serve", help="OpenAI-compatible server loading through the cache",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _model(p)
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
    _park_flags(p)

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

    p = sub.add_parser("verify", help="run the acceptance procedure and write a report")
    p.add_argument("--engine", default="hotweights", choices=["hotweights", "vllm"])
    _model(p)
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

    sub.add_parser("vllm", help="start vLLM with ARGS (hotweights vllm serve MODEL ...), a strict start checked first",
                   description=VLLM_HELP)

    p = sub.add_parser("standby", help="the warm vLLM standby of this interpreter: is it ready, does it fit",
                       description="hotweights vllm serve starts from a warm standby (vLLM imported) when one fits, "
                                   "and prepares one for the next start; HOTWEIGHTS_VLLM_STANDBY=off turns that off")
    _socket_dir(p)
    p.add_argument("--stop", action="store_true", help="retire it (also one still importing vLLM)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("generate", help="load a model (cache or disk) with transformers and complete a prompt")
    _model(p)
    p.add_argument("--prompt", default="The weight cache says")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--load-format", default="hotweights", choices=["hotweights", "auto"])
    p.add_argument("--model-loader-extra-config", default="{}", help="JSON: mode, fallback, socket_dir, ...")
    p.add_argument("--json", action="store_true")
    for command in sub.choices.values():  # every --help shows each option's default
        for action in command._actions:
            if (action.option_strings and not any(action.default is x for x in (None, False, True, argparse.SUPPRESS))
                    and "%(default)" not in (action.help or "")
                    and command.formatter_class is not argparse.ArgumentDefaultsHelpFormatter):
                action.help = f"{action.help or ''} (default: %(default)s)".strip()
    return parser
