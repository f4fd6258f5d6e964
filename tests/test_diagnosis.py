"""One diagnosis for every caller: which candidate serves, else every reason and one advice.

Pure: the asks are stand-ins for an attach or a lookup (the callers are tested with a real
daemon in test_policy.py and test_vllm_budget.py).

Run: pytest tests/test_diagnosis.py
"""

from __future__ import annotations

from dataclasses import dataclass

from hotweights import evidence
from hotweights.key import CacheKey, FieldDiff, ShardId
from hotweights.loading.diagnosis import Candidate, advice_for, diagnose
from hotweights.replies import Outcome

KEY = CacheKey(shards=(ShardId("m.safetensors", 1, "h", "c"),), arch="Qwen3ForCausalLM", dtype="float16")
ENGINE, CHECKPOINT = Candidate(KEY, "engine layout"), Candidate(KEY, "checkpoint layout", "stream")


@dataclass(frozen=True)
class Said:
    outcome: Outcome
    reason: str = ""
    diffs: tuple[FieldDiff, ...] = ()


def answers(*said: Said):
    asked: list[tuple[str, bool]] = []
    replies = iter(said)

    def ask(cand: Candidate, first: bool) -> Said:
        asked.append((cand.label, first))
        return next(replies)

    return ask, asked


def test_the_first_candidate_that_serves_wins_and_later_ones_are_not_asked():
    ask, asked = answers(Said(Outcome.MISS, "cache miss"), Said(Outcome.OK), Said(Outcome.OK))
    found = diagnose([ENGINE, CHECKPOINT, ENGINE], ask)
    assert found.served is CHECKPOINT and found.answer == Said(Outcome.OK)
    assert found.reasons == ("engine layout: cache miss",)
    assert asked == [("engine layout", True), ("checkpoint layout", False)]


def test_no_daemon_stops_the_walk_and_is_no_candidates_fault():
    ask, asked = answers(Said(Outcome.ABSENT, "daemon unavailable: no socket"), Said(Outcome.OK))
    found = diagnose([ENGINE, CHECKPOINT], ask)
    assert found.served is None and found.reason == "daemon unavailable: no socket"
    assert len(asked) == 1
    assert found.strict_message() == evidence.strict_failure("daemon unavailable: no socket")


def test_skipped_candidates_lead_the_reasons_and_the_first_ask_is_not_first():
    ask, asked = answers(Said(Outcome.MISS, "cache miss"))
    found = diagnose([CHECKPOINT], ask, skipped=["engine layout: this vLLM cannot rebuild it"])
    assert found.reason == "engine layout: this vLLM cannot rebuild it; cache miss"
    assert asked == [("checkpoint layout", False)]
    assert found.advice == "preload the model (hotweights preload --model DIR)"


def test_the_strict_message_carries_the_advice_of_the_first_reply_that_has_one():
    dtype = FieldDiff("dtype", "float16", "bfloat16")
    ask, _ = answers(Said(Outcome.MISMATCH, "differs: dtype", (dtype,)), Said(Outcome.MISS, "cache miss"))
    found = diagnose([ENGINE, CHECKPOINT], ask)
    assert found.strict_message() == evidence.strict_failure(
        "engine layout: differs: dtype; checkpoint layout: cache miss",
        "the cache holds this model as float16: start with --dtype float16, or preload bfloat16 too "
        "(hotweights preload --model DIR --dtype bfloat16)")


def test_advice_follows_what_went_wrong():
    assert advice_for(Outcome.MISS) == "preload the model (hotweights preload --model DIR)"
    assert advice_for(Outcome.MISMATCH, [FieldDiff("tp_size", "1", "2")]) == (
        "preload the model as this engine loads it (see the differing fields)")
    assert advice_for(Outcome.ABSENT) == evidence.START_AND_PRELOAD
