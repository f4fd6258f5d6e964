"""``hotweights switch [serve|status|park|stop|start NAME]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .cli_parser import awake_count

if TYPE_CHECKING:
    from .cli_parser import Subparsers


def cmd_switch(args: argparse.Namespace) -> int:
    from .switch import config as switch_config, running

    verb = {"status": _status, "park": _action, "stop": _action, "start": _action, "reload": _reload,
            "example": _example}.get(args.action)
    if verb is not None:
        return verb(args)
    given = {key: getattr(args, key, None) for key in switch_config.SWITCH_KEYS}  # the flags are the keys
    engine_args = list(getattr(args, "cmd", []) or [])
    if args.config and (args.models or engine_args or args.parked_weights):
        raise ValueError("--config names every model; --model NAME=DIR, --parked-weights and -- ENGINE ARGS are the "
                         "quick form (in the file: parked_weights per [[model]])")
    if args.watch_config and not args.config:
        raise ValueError("--watch-config watches the --config file: give one")
    try:
        if args.config:
            def read() -> switch_config.SwitchConfig:
                return switch_config.args_checked(switch_config.overlay(switch_config.load(args.config), given,
                                                                        "the command line"))

            config = read()
            source = running.ConfigSource(Path(args.config), read, args.watch_config)
        else:
            source = None
            config = switch_config.args_checked(
                switch_config.quick(args.models, args.engine, engine_args, given, args.parked_weights or "gpu"))
    except switch_config.ConfigError as exc:
        raise ValueError(str(exc)) from None
    from .switch.port.front import run

    log_dir = Path(config.log_dir).expanduser() if config.log_dir else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    return run(config, log_dir, source)


def _example(_args: argparse.Namespace) -> int:
    """A complete config, every key explained (package data: a wheel ships it; the docs show the same)."""
    sys.stdout.write((Path(__file__).parent / "switch" / "example.toml").read_text())
    return 0


def _front(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The running front's URL and the headers its key wants: from the flags, else ``--config``'s [switch] (without
    flags: ``./switch.toml`` where there is one), else the one front that runs over this user's keeper (its note),
    else the defaults; the key also from ``$VLLM_API_KEY``, as the front reads it."""
    from .switch import config as switch_config

    from .observe import client_host

    host, port, key = args.host, args.port, args.api_key
    path = args.config or (DEFAULT_CONFIG if not (host or port) and Path(DEFAULT_CONFIG).is_file() else None)
    url = ""
    if path:
        try:
            config = switch_config.load(path)
        except switch_config.ConfigError as exc:
            raise ValueError(str(exc)) from None
        host, port, key = host or client_host(config.host), port or config.port, key or config.api_key
    elif not (host or port):
        from .paths import daemon_paths
        from .switch.upstream.leftovers import running_fronts

        fronts = running_fronts(daemon_paths(None).directory)
        url = fronts[0] if len(fronts) == 1 else ""
    key = key or os.environ.get("VLLM_API_KEY", "")
    return url or f"http://{host or '127.0.0.1'}:{port or 8000}", {"authorization": f"Bearer {key}"} if key else {}


def _post(args: argparse.Namespace, path: str) -> dict[str, Any] | None:
    """The running front's answer to ``POST path`` (``_front``'s URL and key), or None once its error is said in one
    line on stderr (``hotweights switch ACTION: ...``)."""
    base, headers = _front(args)
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, method="POST", headers=headers),
                                    timeout=900) as r:
            said: dict[str, Any] = json.loads(r.read())
            return said
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = f"answered {exc.code}"
        print(f"hotweights switch {args.action}: {reason}", file=sys.stderr)
    except OSError as exc:
        print(f"hotweights switch {args.action}: no switch answers at {base} ({getattr(exc, 'reason', exc)})",
              file=sys.stderr)
    return None


def _action(args: argparse.Namespace) -> int:
    """``hotweights switch park|stop|start NAME``: the front's ``POST /switch/models/NAME/ACTION``; ``stop --all``:
    its ``POST /switch/unload``."""
    if args.all:
        if args.action != "stop" or args.target:
            raise ValueError("--all goes with stop alone: hotweights switch stop --all")
        said = _post(args, "/switch/unload")
        if said is None:
            return 1
        print(json.dumps(said) if args.json else "\n".join(f"{n}: {did}" for n, did in said["stopped"].items()))
        return 0
    if not args.target:
        raise ValueError(f"hotweights switch {args.action} NAME: which model")
    said = _post(args, f"/switch/models/{args.target}/{args.action}")
    if said is None:
        return 1
    print(json.dumps(said) if args.json else f"{said['model']}: {said['did']}")
    return 0


def _reload(args: argparse.Namespace) -> int:
    """``hotweights switch reload``: the running front reads its configuration file again (``POST
    /switch/reload``, as SIGHUP does): what it added, removed and changed, or why it refused (the running one
    stays)."""
    said = _post(args, "/switch/reload")
    if said is None:
        return 1
    done = "; ".join(f"{what} {', '.join(said[what])}" for what in ("added", "removed", "changed") if said[what])
    print(json.dumps(said) if args.json else f"reloaded: {done or 'no model changed'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    base, headers = _front(args)
    url = f"{base}/switch/status"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            state = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        print(f"hotweights switch status: {url} answered {exc.code}" + (" (give --api-key)" if exc.code == 401 else ""),
              file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"hotweights switch status: no switch answers at {url} ({getattr(exc, 'reason', exc)})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(state))
        return 0
    from .switch.model import ModelRow

    print(f"{'MODEL':<20} {'STATE':<12} {'ENGINE':<10} {'GPUS':<6} {'PID':>7} {'GPU MiB':>8} {'WAKES':>5} "
          f"{'WAITING':>7}  LAST USED")
    stops = "no sleep mode" if state.get("parking", True) else "parking off"
    for m in (ModelRow.from_json(row) for row in state["models"]):
        last = "-" if not m.last_used else f"{time.time() - m.last_used:.0f} s ago"
        name = m.name + (" *" if m.name == state["default"] else "")
        gpu = "-" if m.gpu_mib is None else m.gpu_mib
        gpus = ",".join(str(g) for g in m.gpus or []) or "any"
        print(f"{name:<20} {m.state:<12} {m.engine:<10} {gpus:<6} {m.pid or '-':>7} {gpu:>8} {m.wakes:>5} "
              f"{m.waiting:>7}  {last}" + (f"  ({m.error})" if m.error else "")
              + ("" if m.parks else f"  ({stops}: a switch stops and starts it)"))
    for m in (ModelRow.from_json(row) for row in state["models"]):
        if m.from_disk:  # the keeper could not take it: each start reads the disk
            print(f"note: {m.name} is served from its checkpoint on disk, {m.cached}")
    return 0


class EngineKinds:
    """The switch's engine kinds, as argparse's choices: read from its table (``switch.kinds.KINDS``) only when
    argparse asks (a value to check, the help), as importing the table takes ~0.1 s that every other command
    would pay."""

    def __iter__(self) -> Iterator[str]:
        from .switch.kinds import KINDS

        return iter(KINDS)

    def __contains__(self, name: object) -> bool:
        return name in list(self)


DEFAULT_CONFIG = "switch.toml"  # status and the operator verbs read it from the working directory without flags


def register(sub: Subparsers) -> None:
    """``hotweights switch``."""
    p = sub.add_parser("switch", help="many models behind one port: a request's model wakes its engine, the others "
                                      "park (--config FILE, or --model NAME=DIR ... [-- ENGINE ARGS])")
    p.add_argument("action", nargs="?", default="serve",
                   choices=["serve", "status", "park", "stop", "start", "reload", "example"],
                   help="serve (default); status: each model's state, from a running switch; park, stop or start "
                        "NAME: that model's engine, in a running switch; reload: the running switch reads its "
                        "--config file again (as SIGHUP does); example: print a complete --config file, every key "
                        "explained (`hotweights switch example > switch.toml`)")
    p.add_argument("target", nargs="?", default=None, help="park/stop/start: the model (its name or an alias)")
    p.add_argument("--config", default=None, help="TOML file: [switch] and one [[model]] table per model "
                                                  "(`hotweights switch example` prints a complete one); status and "
                                                  "the operator verbs read ./switch.toml without flags")
    p.add_argument("--model", dest="models", action="append", default=[], metavar="NAME=DIR",
                   help="the quick form: a model and its checkpoint (repeat; the first is the default)")
    p.add_argument("--engine", default="hotweights", choices=EngineKinds(), metavar="KIND",
                   help="the quick form's engine: %(choices)s (default %(default)s)")
    p.add_argument("--host", default=None, help="address of the front (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port of the front (default 8000)")
    p.add_argument("--max-awake", type=awake_count, default=None,
                   help="engines awake at once per GPU: auto (default: as many as GPU memory holds) or a cap")
    p.add_argument("--request-timeout-s", type=float, default=None,
                   help="how long a request waits for its model before a 503 (default 300)")
    p.add_argument("--api-key", default=None, help="Bearer key the front asks for on /v1 (default: $VLLM_API_KEY; "
                                                   "status sends it)")
    p.add_argument("--log-dir", default=None, help="where each engine's log goes (default: a new temporary directory)")
    p.add_argument("--no-parking", dest="parking", action="store_const", const=False, default=None,
                   help="a switch stops the engine and starts the next one instead of parking it (for comparison)")
    p.add_argument("--parked-weights", choices=["gpu", "host"], default=None,
                   help="the quick form: where a parked engine's weights stay (host: off the GPU, so more models fit; "
                        "a wake uploads them)")
    p.add_argument("--stop-keeper", action="store_const", const=True, default=None,
                   help="on the way out, stop the keeper if this front started it (else it keeps the weights for the "
                        "next start)")
    p.add_argument("--watch-config", action="store_true",
                   help="read the --config file again whenever it changes (as SIGHUP and `switch reload` do)")
    p.add_argument("--keep-standbys", action="store_const", const=True, default=None,
                   help="on the way out, leave the engines' warm standbys running for the next front (else they are "
                        "retired with it)")
    p.add_argument("--schedule", choices=["fair", "fifo", "deadline"], default=None,
                   help="which waiting model a switch serves next: fair (default: the most requests waiting; one "
                        "waiting over starve_after_s first), fifo (first come), or deadline (the first due: a first "
                        "token slo_ttft_s after its request, a held stream's next token slo_token_s a token after "
                        "its first; a busy engine's turn ends by it)")
    p.add_argument("--slo-ttft-s", type=float, default=None,
                   help="deadline schedule: a request's first token is due this long after it came (default 2)")
    p.add_argument("--slo-token-s", type=float, default=None,
                   help="deadline schedule: a held stream's next token is due this long a token after its first "
                        "(default 0.1)")
    p.add_argument("--first-token-s", type=float, default=None,
                   help="deadline schedule: a model is due awake this long before its request's first token is due: "
                        "its prefill and the relay (default 0.4)")
    p.add_argument("--turn-s", type=float, default=None,
                   help="where memory forces a choice between busy engines, a busy one leaves once another model's "
                        "waiting requests have waited this long in sum per request in flight on it (default 1)")
    p.add_argument("--preempt", action="store_const", const=True, default=None,
                   help="a busy engine whose turn is over pauses its streamed requests at once (each continues on "
                        "its next wake, seamless in the client's stream) rather than finishing them first")
    p.add_argument("--no-keep-kv", dest="keep_kv", action="store_const", const=False, default=None,
                   help="with --preempt, a paused request continues by a new request from its token ids (its prompt "
                        "computed again) even where its engine's park could keep its KV cache (the embedded "
                        "engine; vLLM on a GPU)")
    p.add_argument("--held-kv", choices=["gpu", "host"], default=None,
                   help="host: with --preempt, a vLLM engine's park that holds streams moves their KV cache to pinned "
                        "host memory, keeping on the GPU only what a park without them does (default gpu)")
    p.add_argument("--tiers", choices=["fixed", "traffic"], default=None,
                   help="traffic: as many models as parked_weights = \"gpu\" names hold the GPU tier, the busiest "
                        "over the last --tier-window-s; the others park in host memory (default fixed: as configured)")
    p.add_argument("--tier-window-s", type=float, default=None,
                   help="tiers from traffic: the window demand is counted over, and a move's gain (default 300)")
    p.add_argument("--preload-jobs", type=int, default=None,
                   help="start-up's preloads at once, where GPU memory allows (default 0: 4 with GPUs, else 1)")
    p.add_argument("--start-jobs", type=int, default=None,
                   help="start-up's engine starts at once where none profiles the GPU's memory (vLLM with "
                        "--kv-cache-memory-bytes) and GPU memory holds them (default 0: 4 with GPUs, else 1)")
    p.add_argument("--compile-ahead", action=argparse.BooleanOptionalAction, default=None,
                   help="the first start's compile runs beside its preload (a vLLM server with dummy weights), or "
                        "not (the default: it lost on an H100, where the preload was short)")
    p.add_argument("--no-read-ahead", dest="read_ahead", action="store_const", const=False, default=None,
                   help="start-up does not read the next preloads' checkpoints into the page cache ahead of them")
    p.add_argument("--all", action="store_true", help="stop: every model's engine (the front's POST /switch/unload)")
    p.add_argument("--json", action="store_true", help="status: one JSON object")
    p.set_defaults(run=cmd_switch)
