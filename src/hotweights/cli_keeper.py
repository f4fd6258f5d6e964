"""The keeper's subcommands of ``hotweights``: ``daemon``, ``status``, ``release``, ``stop``. Thin, as ``cli``
is, and torch-free: they start fast."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any
import sys

from .cli_parser import byte_size, socket_dir_option
from .console import emit as _emit
from .console import entries

if TYPE_CHECKING:
    from .cli_parser import Subparsers


def cmd_daemon(args: argparse.Namespace) -> int:
    from .errors import DaemonAlreadyRunning
    from .keeper.process import detach
    from .keeper.main import run
    from .keeper.server import DaemonConfig
    from .paths import daemon_paths, ensure_socket_dir

    paths = daemon_paths(args.socket_dir)
    if getattr(args, "init", False):  # PID 1 of a container: the daemon as its child (keeper/init.py)
        from .keeper.init import run_init

        ensure_socket_dir(paths.directory)
        argv = ["daemon", "--socket-dir", str(paths.directory)]
        for name in ("max_bytes", "metrics_port", "metrics_host"):
            if getattr(args, name) is not None:
                argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        return run_init([sys.executable, "-m", "hotweights", *argv], paths.lock)
    if args.replace:  # a daemon under a service manager is restarted by it (its fd store), not replaced from here
        from .keeper.handover import restart_managed, running_status

        old = running_status(paths)
        if old is not None and old.service_manager:
            print(f"hotweights daemon: {restart_managed(paths, old)}", flush=True)
            return 0
    if args.detach:
        ensure_socket_dir(paths.directory)
        if detach(paths.log):
            print(f"hotweights daemon: starting in the background; its log: {paths.log}", flush=True)
            return 0
    given = frozenset(name for name in ("max_bytes", "metrics_port", "metrics_host") if getattr(args, name) is not None)
    config = DaemonConfig(paths, max_bytes=args.max_bytes or 0, metrics_port=args.metrics_port or 0,
                          metrics_host=args.metrics_host or "127.0.0.1")
    try:
        return run(config, replace=args.replace, given=given)
    except DaemonAlreadyRunning as exc:
        print(f"hotweights daemon: {exc}", file=sys.stderr)
        return 3


def cmd_status(args: argparse.Namespace) -> int:
    from .client import connect
    from .console import status_table
    from .errors import DaemonUnavailable, TrustError
    from .paths import daemon_paths

    try:
        with connect(daemon_paths(args.socket_dir)) as client:
            status = client.status()
    except (DaemonUnavailable, TrustError) as exc:
        start = "" if isinstance(exc, TrustError) else "; `hotweights preload --model DIR` starts one and fills it"
        if not args.json:
            raise type(exc)(f"{exc}{start}") from None
        _emit(args, {"running": False, "reason": str(exc)}, "")
        return 1
    data = {"running": True, "pid": status.pid, "version": status.daemon_version, "uptime_s": round(status.uptime_s, 1),
            "entries": status.entries, "bytes_by_device": status.bytes_by_device, "max_bytes": status.max_bytes,
            "parked_by_device": status.parked_by_device,
            "torch_imported": status.torch_imported, "socket": str(client.socket_path)}
    _emit(args, data, status_table(status, client.socket_path))
    return 0


def _one_key(args: argparse.Namespace, client: Any, empty: dict[str, Any]) -> str | None:
    """The short key a unique prefix (``args.key``) names, as in `hotweights status`; None (said) if none or several."""
    keys = [e.key for e in client.status().rows() if e.key.startswith(args.key)]
    if len(keys) == 1:
        return keys[0]
    _emit(args, {**empty, "matches": keys}, f"no entry with key {args.key} (hotweights status lists them)" if not keys
          else f"{args.key} names {entries(len(keys))} ({' '.join(keys)}); give more of the key")
    return None


def cmd_release(args: argparse.Namespace) -> int:
    from .client import connect
    from .paths import daemon_paths

    with connect(daemon_paths(args.socket_dir)) as client:
        key = None
        if not args.all and (key := _one_key(args, client, {"released": []})) is None:
            return 1
        released = client.release(key).released
    _emit(args, {"released": released}, f"released {entries(len(released))}: {' '.join(released) or '-'}")
    return 0


def cmd_demote(args: argparse.Namespace) -> int:
    import time

    from .client import connect
    from .paths import daemon_paths

    start = time.perf_counter()
    with connect(daemon_paths(args.socket_dir)) as client:
        if (key := _one_key(args, client, {"demoted": ""})) is None:
            return 1
        from .config import AttachConfig
        from .loading import resident, tiers
        from .loading.attach import attach_tensors

        manifest = client.describe(key)  # the full key, to map the entry for the copy
        mapped = attach_tensors(manifest.key, AttachConfig(socket_path=str(client.socket_path)))
        if not mapped.ok:
            raise resident.WeightsGone(f"cannot map {key} to copy it: {mapped.reason}")
        copied = tiers.host_copy(client, only=manifest.key)
        if not args.keep:
            client.release(key, tier="device")
    seconds = time.perf_counter() - start
    where = "kept on its device too" if args.keep else "its device copy released (engines mapping it keep it until " \
                                                       "they deep-park or stop)"
    _emit(args, {"demoted": key, "host_bytes": copied, "kept": args.keep, "seconds": round(seconds, 3)},
          f"{key}: host copy of {copied / (1 << 30):.2f} GiB in {seconds:.2f} s; {where}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    import time

    from .client import connect
    from .paths import daemon_paths

    start = time.perf_counter()
    with connect(daemon_paths(args.socket_dir)) as client:
        if (key := _one_key(args, client, {"promoted": ""})) is None:
            return 1
        from .loading import tiers

        uploaded = tiers.promote(client, client.describe(key))
    seconds = time.perf_counter() - start
    done = f"its device copy made from its host copy, {uploaded / 1e9:.2f} GB in {seconds:.2f} s" if uploaded else \
        "its device copy is there already"
    _emit(args, {"promoted": key, "device_bytes": uploaded, "seconds": round(seconds, 3)}, f"{key}: {done}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    import time

    from .client import connect
    from .errors import DaemonUnavailable
    from .paths import daemon_paths

    paths = daemon_paths(args.socket_dir)
    try:
        with connect(paths) as client:
            client.stop()
    except DaemonUnavailable as exc:  # stopping what is not running is done, as with a service manager
        print(f"no daemon running ({exc})")
        return 0
    deadline = time.monotonic() + 10
    while paths.socket.exists() and time.monotonic() < deadline:  # gone when we return: `stop; stop` works
        time.sleep(0.05)
    print("daemon stopped")
    return 0


def cmd_parked(args: argparse.Namespace) -> int:
    import time

    from .paths import daemon_paths
    from .parked import records as parked

    directory = parked.parked_dir(daemon_paths(args.socket_dir).directory)
    found = parked.records(directory)
    if args.wake is not None or args.retire is not None:
        chosen = [r for r in found if args.retire == "all" or r.pid == _int(args.retire)
                  or (r.pid == args.wake and r.level)]
        if not chosen:
            _emit(args, {"done": []}, f"no parked engine with pid {args.wake or args.retire} "
                                     f"(hotweights parked lists them)")
            return 1
        for record in chosen:
            if args.wake is not None:
                try:
                    seconds = parked.wake(directory, record)
                except (OSError, TimeoutError) as exc:
                    why = parked.wake_refusal(record, exc)  # reads its log and asks the server: once
                    _emit(args, {"woke": None, "pid": record.pid, "error": why},
                          f"could not wake pid {record.pid}: {why}")
                    return 1
                _emit(args, {"woke": record.pid, "seconds": round(seconds, 3)},
                     f"woke pid {record.pid} in {seconds:.3f} s; it serves at {record.url} (its log: {record.log})")
            else:
                parked.retire(directory, record, "asked to (hotweights parked --retire)")
        if args.retire is not None:
            _emit(args, {"retired": [r.pid for r in chosen]}, f"retired {' '.join(str(r.pid) for r in chosen)}")
        return 0
    rows = [{"pid": r.pid, "url": r.url, "engine": r.engine, "level": r.level, "log": r.log, "launcher": r.front,
             "parked_s": round(time.time() - r.parked_at) if r.level else 0,
             "model": r.start.get("arg model", "").strip('"')} for r in found]
    header = f"{'PID':<8}{'ENGINE':<11}{'URL':<24}{'STATE':<30}MODEL"
    text = "\n".join([header, *map(_parked_line, rows)]) if rows else "no engines started with --park-on-exit"
    _emit(args, {"parked": rows}, text)
    return 0


def _parked_line(r: dict[str, Any]) -> str:
    state = f"parked at level {r['level']}, {r['parked_s']} s" if r["level"] else "awake"
    if r["launcher"]:
        state += f", launcher {r['launcher']}"
    return f"{r['pid']:<8}{r['engine']:<11}{r['url']:<24}{state:<30}{r['model']}"


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def register(sub: Subparsers) -> None:
    """The keeper's subcommands."""
    p = sub.add_parser("daemon", help="run the keeper daemon in the foreground")
    socket_dir_option(p)
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
    p.set_defaults(run=cmd_daemon)

    p = sub.add_parser("status", help="what the daemon holds")
    p.add_argument("--json", action="store_true")
    socket_dir_option(p)
    p.set_defaults(run=cmd_status)

    p = sub.add_parser("release", help="drop an entry (engines that attached keep their mapping)")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("key", nargs="?", help="short key from `hotweights status`")
    group.add_argument("--all", action="store_true")
    p.add_argument("--json", action="store_true")
    socket_dir_option(p)
    p.set_defaults(run=cmd_release)

    p = sub.add_parser("parked", help="the parked engines of this user (--park-on-exit): list, wake, retire")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--wake", type=int, metavar="PID", help="wake it where it is (it serves on, in the background)")
    group.add_argument("--retire", metavar="PID|all", help="stop it (or all of them) and free what it holds")
    p.add_argument("--json", action="store_true")
    socket_dir_option(p)
    p.set_defaults(run=cmd_parked)

    p = sub.add_parser("demote", help="move an entry to host memory (a host copy; deep-parked engines wake from it)")
    p.add_argument("key", help="short key (or a unique prefix) from `hotweights status`")
    p.add_argument("--keep", action="store_true", help="keep the device copy too (make the host copy only)")
    p.add_argument("--json", action="store_true")
    socket_dir_option(p)
    p.set_defaults(run=cmd_demote)

    p = sub.add_parser("promote", help="make an entry's device copy again from its host copy (engines then map it)")
    p.add_argument("key", help="short key (or a unique prefix) from `hotweights status`")
    p.add_argument("--json", action="store_true")
    socket_dir_option(p)
    p.set_defaults(run=cmd_promote)

    p = sub.add_parser("stop", help="stop the daemon (engines that attached keep their weights)")
    socket_dir_option(p)
    p.set_defaults(run=cmd_stop)
