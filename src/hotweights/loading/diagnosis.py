"""Can the cache serve this start, and if not, why: one answer for every caller.

An engine offers an ordered list of ``Candidate`` keys (the vLLM plugin: engine layout,
then checkpoint layout; transformers: one checkpoint key). ``diagnose`` asks about each
in turn with the caller's ``ask`` and stops at the first that serves, or at an absent
daemon (no other key can do better). The ``Diagnosis`` names the candidate that served,
or gives every candidate's reason and one piece of advice for the strict message.

Callers, by how they ask:

- ``policy.attach_first`` attaches each candidate and lets the engine use it: the load.
- ``engines/vllm/budget`` looks each one up while vLLM sets up the device: why a start
  maps nothing, and a strict start that cannot be served fails there, not on a budget.
- ``engines/vllm/preflight`` is coarser on purpose: it runs before vLLM has resolved the
  dtype and the TP rank, so it cannot build the keys; it fails a strict start only where
  every candidate must fail (no daemon, or no entry of the model at all).

Torch-free: the preflight imports it before vLLM is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .. import evidence
from ..key import CacheKey, FieldDiff
from ..replies import Outcome


@dataclass(frozen=True, slots=True)
class Candidate:
    key: CacheKey
    label: str = ""  # "engine layout": prefixes its reason when several candidates are tried
    evidence_mode: str | None = None  # the mode named in the Mapped line, when not the config's


class Reply(Protocol):
    """What an ask returns: an attach result or a lookup answer."""

    @property
    def outcome(self) -> Outcome: ...

    @property
    def reason(self) -> str: ...

    @property
    def diffs(self) -> Sequence[FieldDiff]: ...


R = TypeVar("R", bound=Reply)


@dataclass(frozen=True, slots=True)
class Diagnosis(Generic[R]):
    served: Candidate | None  # the first candidate that serves, if any
    answer: R | None  # its reply
    reasons: tuple[str, ...]  # why each candidate before it (or every one) did not serve
    advice: str  # what to do, from the first reply that says

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def strict_message(self) -> str:
        """``Weight cache unusable (<reasons>) and fallback is disabled; <advice>, ...``."""
        return evidence.strict_failure(self.reason, self.advice or evidence.START_AND_PRELOAD)


def diagnose(candidates: Sequence[Candidate], ask: Callable[[Candidate, bool], R], *,
             skipped: Sequence[str] = ()) -> Diagnosis[R]:
    """Ask about each candidate in order; ``ask(candidate, first)``, ``first`` while nothing
    was asked or skipped before it. ``skipped``: why candidates the engine cannot use were left
    out (they lead the reasons)."""
    reasons, advice = list(skipped), ""
    for cand in candidates:
        answer = ask(cand, not reasons)
        if answer.outcome is Outcome.OK:
            return Diagnosis(cand, answer, tuple(reasons), advice)
        advice = advice or advice_for(answer.outcome, answer.diffs)
        # labelled when several were tried; no daemon is no candidate's fault
        labelled = len(candidates) > 1 and answer.outcome is not Outcome.ABSENT
        reasons.append(f"{cand.label}: {answer.reason}" if labelled else answer.reason)
        if answer.outcome is Outcome.ABSENT:
            break  # no daemon: no other key can do better
    return Diagnosis(None, None, tuple(reasons), advice)


def advice_for(outcome: Outcome, diffs: Sequence[FieldDiff] = ()) -> str:
    """What to do about a strict failure, by what the attach came to."""
    if outcome is Outcome.MISS:
        return "preload the model (hotweights preload --model DIR)"
    for diff in diffs:
        if diff.field == "dtype":
            return (f"the cache holds this model as {diff.cached}: start with --dtype {diff.cached}, or preload "
                    f"{diff.requested} too (hotweights preload --model DIR --dtype {diff.requested})")
    if outcome is Outcome.MISMATCH:
        return "preload the model as this engine loads it (see the differing fields)"
    return evidence.START_AND_PRELOAD
