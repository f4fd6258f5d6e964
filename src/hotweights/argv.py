"""Options on a command line, read one way everywhere (vLLM's, hotweights' own): ``--flag VALUE`` and
``--flag=VALUE``, the last one given wins, as argparse (and so vLLM) reads them.

Stdlib only. Not covered: argparse's abbreviations (``--load`` for ``--load-format``) and options inside
``--config`` files; whoever reads a command line for its meaning (``engines.vllm.start.VllmStart``) says so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Option:
    """One option and its spellings. ``takes``: ``value`` (the next token, or ``=VALUE``), ``number`` (the next
    token when it is a number: ``--park-on-exit [1|2]``), ``none`` (a bare flag)."""

    names: tuple[str, ...]
    takes: Literal["value", "number", "none"] = "value"

    def spans(self, argv: Sequence[str]) -> Iterator[tuple[int, int, str | None]]:
        """``(first, end, value)`` of each occurrence: ``argv[first:end]`` is the option with its value."""
        i = 0
        while i < len(argv):
            name, eq, inline = argv[i].partition("=")
            if name not in self.names:
                i += 1
                continue
            if eq or self.takes == "none":
                yield i, i + 1, inline if eq else None
                i += 1
                continue
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and (self.takes == "value" or _is_number(nxt)):
                yield i, i + 2, nxt
                i += 2
            else:
                yield i, i + 1, None
                i += 1

    def value(self, argv: Sequence[str], bare: str | None = None) -> str | None:
        """The last value given (``bare`` for an occurrence without one), None when the option is absent."""
        found = [bare if v is None else v for _, _, v in self.spans(argv)]
        return found[-1] if found else None

    def present(self, argv: Sequence[str]) -> bool:
        return next(self.spans(argv), None) is not None

    def strip(self, argv: Sequence[str]) -> list[str]:
        """``argv`` without any occurrence of the option (its values with it)."""
        cut = {i for first, end, _ in self.spans(argv) for i in range(first, end)}
        return [a for i, a in enumerate(argv) if i not in cut]


def strip(argv: Sequence[str], *options: Option) -> list[str]:
    out = list(argv)
    for option in options:
        out = option.strip(out)
    return out


def refused(parser: argparse.ArgumentParser, args: Sequence[str], engine: str) -> str:
    """What ``parser`` (an engine's own: vLLM's, ``hotweights serve``'s) says of ``args`` in one line ("" where it
    takes them): a flag it does not know, with the closest one it does, or a value it refuses, in its own words."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            _known, unknown = parser.parse_known_args(list(args))
    except SystemExit:  # its own last line: "vllm: error: argument --dtype: invalid choice ..."
        lines = said.getvalue().strip().splitlines() or ["refused"]
        return f"{engine} refuses its args: " + lines[-1].split("error: ", 1)[-1]
    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    if not flags:
        return f"{engine} takes no {' '.join(unknown)!r} in its args" if unknown else ""
    import difflib

    known = [s for action in parser._actions for s in action.option_strings]
    close = difflib.get_close_matches(flags[0], known, n=1)
    return f"{flags[0]} is not an argument of {engine}" + (f" (did you mean {close[0]}?)" if close else "")
