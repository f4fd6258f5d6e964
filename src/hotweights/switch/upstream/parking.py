"""The calls that park and wake an engine of each kind, its streams held or not (issue 69). Torch-free.

A park that holds streams keeps the engine's KV cache and its requests in flight, paused, and gives back only the
weights' GPU memory; its wake maps the weights again and lets the requests go on from their next token:

- the embedded engine (``serve/park.py``): ``/sleep?level=N&mode=keep``, then ``/wake_up``;
- vLLM 0.26 (``engines/vllm/park.py``'s ``hold`` and ``release``, which ``patches.install_park`` adds to its
  workers): ``/pause?mode=keep`` (its scheduler paused, its requests kept), then ``hotweights_hold`` over
  ``/collective_rpc`` (the zero-copy weights unmapped at level 2, none of vLLM's sleep called; with ``held_kv =
  "host"`` the KV cache moved to pinned host memory); the wake is ``hotweights_release`` (refused before anything is
  mapped where the weights, and a KV cache in host memory, cannot fit), then ``/resume``.

A park that holds nothing is each engine's own sleep (``/sleep?level=N``) and its wake ``/wake_up``; a vLLM engine
whose held parks move the KV cache to host memory has its pinned host buffers made at its first
(``hotweights_pin_host``: on an H100 the first held park that made them took 1.40 s, the next ones 0.05 s), while
nothing waits on it.
"""

from __future__ import annotations

from typing import Any

Ask = tuple[str, dict[str, Any] | None]  # a POST: its path, and its JSON body (None: empty)


def park_asks(kind: str, level: int, keep: bool, kv_to_host: bool = False, pin_host: bool = False) -> list[Ask]:
    """What parks an engine of ``kind`` at ``level``, keeping its KV cache and requests where ``keep`` (vLLM: the
    KV cache moved to pinned host memory where ``kv_to_host``, whose buffers a plain park makes where ``pin_host``:
    the engine's first)."""
    if not keep:
        pin = [("/collective_rpc", {"method": "hotweights_pin_host"})] if kind == "vllm" and pin_host else []
        return [(f"/sleep?level={level}", None), *pin]
    if kind == "vllm":
        hold = {"method": "hotweights_hold", "args": [str(level), "host" if kv_to_host else "gpu"]}
        return [("/pause?mode=keep", None), ("/collective_rpc", hold)]
    return [(f"/sleep?level={level}&mode=keep", None)]


def wake_asks(kind: str, held: bool) -> list[Ask]:
    """What wakes an engine of ``kind`` (``held``: parked keeping its KV cache and requests)."""
    if held and kind == "vllm":
        return [("/collective_rpc", {"method": "hotweights_release"}), ("/resume", None)]
    return [("/wake_up", None)]
