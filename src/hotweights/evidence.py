"""The evidence lines of DESIGN.md, built in one place.

Users and ``hotweights verify`` grep for these exact shapes
(``Mapped|weight cache|falling back``); tests assert them character for character.
Change a shape only together with the README section "Evidence lines".
"""

from __future__ import annotations

GIB = 1 << 30


def daemon_ready(socket_path: str, pid: int) -> str:
    return f"Weight cache daemon READY: socket={socket_path} pid={pid}"


def published(num_tensors: int, nbytes: int, model: str, key_short: str, device: str, seconds: float) -> str:
    return (
        f"Published {num_tensors} tensors ({nbytes / GIB:.2f} GiB) to weight cache: "
        f"{model} [{key_short}] on {device} in {seconds:.2f} s"
    )


def mapped(num_tensors: int, nbytes: int, socket_path: str, mode: str, ms: float) -> str:
    return (
        f"Mapped {num_tensors} tensors ({nbytes / GIB:.2f} GiB) from weight cache daemon "
        f"{socket_path} (mode={mode}) in {ms:.1f} ms"
    )


def falling_back(reason: str) -> str:
    return f"Weight cache unusable ({reason}); falling back to disk loading"


def strict_failure(reason: str) -> str:
    return (
        f"Weight cache unusable ({reason}) and fallback is disabled; start the daemon and "
        f"preload the model (hotweights preload --model DIR), or set fallback to true"
    )
