"""The embedded server's request rules and logit adjustments, without a server (fast tier).

Run: pytest tests/test_sampling.py
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from hotweights.serve.generate import SamplingParams, _adjusted
from hotweights.serve.schema import BadRequest, ChatRequest, CompletionRequest


def test_penalties_follow_openais_definition_and_bias_adds():
    logits = torch.zeros(5)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((4, 3.0),))
    got = _adjusted(logits, params, out=[1, 1, 2])
    # token 1 seen twice: -0.25*2 - 0.5; token 2 once: -0.25 - 0.5; token 4: the bias
    assert got.tolist() == [0.0, -1.0, -0.75, 0.0, 3.0]
    assert _adjusted(logits, SamplingParams(), out=[1]).tolist() == [0.0] * 5


def test_prompts_are_text_or_token_ids_and_ids_must_be_in_the_vocabulary():
    assert CompletionRequest(prompt="ab").prompts(10) == ["ab"]
    assert CompletionRequest(prompt=[1, 2]).prompts(10) == [[1, 2]]
    assert CompletionRequest(prompt=[[1], [2, 3]]).prompts(10) == [[1], [2, 3]]
    with pytest.raises(BadRequest, match="outside the vocabulary"):
        CompletionRequest(prompt=[1, 10]).prompts(10)


def test_text_parts_join_and_other_parts_are_refused_by_position():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = ChatRequest(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": parts, "name": "u"}])
    assert req.dialog() == [{"role": "system", "content": "s"}, {"role": "user", "content": "ab", "name": "u"}]
    bad = ChatRequest(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])
    with pytest.raises(BadRequest) as err:
        bad.dialog()
    assert err.value.param == "messages.0.content.0"


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "required"}, "tool_choice"), ({"best_of": 3}, "best_of"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options.continuous_usage_stats"),
])
def test_fields_of_the_api_it_does_not_serve_are_refused(fields, param):
    with pytest.raises(BadRequest) as err:
        CompletionRequest(prompt="x", **fields).refuse_unserved()
    assert err.value.param == param
    CompletionRequest(prompt="x", tool_choice="none", best_of=1, response_format={"type": "text"}).refuse_unserved()


def test_logprobs_are_asked_as_each_api_spells_them():
    """Completions: ``logprobs: k``; chat: ``logprobs: true`` and ``top_logprobs: k``; k at most 20 (vLLM's)."""
    assert CompletionRequest(prompt="x", logprobs=3).top_logprobs_wanted() == 3
    assert CompletionRequest(prompt="x").top_logprobs_wanted() is None
    chat = [{"role": "user", "content": "hi"}]
    assert ChatRequest(messages=chat, logprobs=True, top_logprobs=2).top_logprobs_wanted() == 2
    assert ChatRequest(messages=chat, logprobs=True).top_logprobs_wanted() == 0
    assert ChatRequest(messages=chat).top_logprobs_wanted() is None
    for bad, param in ((ChatRequest(messages=chat, top_logprobs=2), "top_logprobs"),
                       (CompletionRequest(prompt="x", logprobs=1, echo=True), "logprobs")):
        with pytest.raises(BadRequest) as err:
            bad.top_logprobs_wanted()
        assert err.value.param == param
    with pytest.raises(ValidationError):
        CompletionRequest(prompt="x", logprobs=21)
