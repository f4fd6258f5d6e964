"""Options on a command line, read one way everywhere (vLLM's, hotweights' own): ``--flag VALUE`` and
``--flag=VALUE``, the last one given wins, as argparse (and so vLLM) reads them.

Stdlib only. Not covered: argparse's abbreviations (``--load`` for ``--load-format``) and options inside
``--config`` files; whoever reads a command line for its meaning (``engines.vllm.start.VllmStart``) says so.
"""

from __future__ import annotations

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
