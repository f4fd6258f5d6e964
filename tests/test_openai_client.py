"""The official ``openai`` Python client (pinned in the test extra) against the embedded server.

What clients send is served (content parts, prompt lists, token ids, n, echo, usage in a stream,
logit bias, top_k); what the server cannot serve is refused with the client's own exception,
naming the field, never ignored. Run: pytest tests/test_openai_client.py
"""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

pytestmark = pytest.mark.slow  # a real server process

GREEDY = {"model": "tiny", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def client(warm_server):
    return openai.OpenAI(base_url=warm_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat_text(client, content, **kw) -> str:
    reply = client.chat.completions.create(messages=[{"role": "user", "content": content}], **{**GREEDY, **kw})
    return reply.choices[0].message.content


def test_models_version_and_a_plain_completion(client, warm_server):
    assert [m.id for m in client.models.list()] == ["tiny"]
    with urllib.request.urlopen(warm_server.url + "/version") as r:
        assert json.loads(r.read())["version"]
    reply = client.completions.create(prompt="The weight cache", **GREEDY)
    assert reply.object == "text_completion" and reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens == len("The weight cache")  # byte-level demo tokenizer
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_content_given_as_text_parts_is_the_same_message_as_a_string(client):
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    assert chat_text(client, parts) == chat_text(client, "Hello")


def test_a_list_of_prompts_and_token_ids_give_one_choice_each_in_order(client):
    one = [client.completions.create(prompt=p, **GREEDY).choices[0].text for p in ("ab", "cd")]
    both = client.completions.create(prompt=["ab", "cd"], **GREEDY)
    assert [c.index for c in both.choices] == [0, 1] and [c.text for c in both.choices] == one
    ids = list(b"ab")  # the demo tokenizer's first 256 ids are the bytes
    by_ids = client.completions.create(prompt=ids, **GREEDY)
    assert by_ids.choices[0].text == one[0] and by_ids.usage.prompt_tokens == 2


def test_n_choices_greedy_alike_and_seeded_samples_reproducible(client):
    greedy = client.completions.create(prompt="ab", n=3, **GREEDY)
    assert [c.index for c in greedy.choices] == [0, 1, 2] and len({c.text for c in greedy.choices}) == 1
    sampled = {"prompt": "ab", "n": 2, "model": "tiny", "max_tokens": 8, "temperature": 1.0, "seed": 5}
    first, again = (client.completions.create(**sampled) for _ in range(2))
    assert [c.text for c in first.choices] == [c.text for c in again.choices]


def test_echo_puts_the_prompt_before_the_completion(client):
    plain = client.completions.create(prompt="ab", **GREEDY).choices[0].text
    assert client.completions.create(prompt="ab", echo=True, **GREEDY).choices[0].text == "ab" + plain


def test_a_stream_with_include_usage_ends_with_the_usage(client):
    whole = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **GREEDY)
    chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole.choices[0].message.content


def test_logit_bias_and_top_k_act_on_the_choice(client):
    forced = client.completions.create(prompt="ab", logit_bias={str(ord("z")): 100}, **GREEDY)
    assert forced.choices[0].text == "z" * forced.usage.completion_tokens
    greedy = client.completions.create(prompt="ab", **GREEDY).choices[0].text
    top1 = client.completions.create(prompt="ab", model="tiny", max_tokens=8, temperature=1.0, seed=1,
                                     extra_body={"top_k": 1})
    assert top1.choices[0].text == greedy  # sampling from the one most likely token is greedy


def test_an_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(prompt="ab", model="gpt-4o", max_tokens=2)
    assert err.value.status_code == 404 and err.value.body["param"] == "model"


@pytest.mark.parametrize("kw, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ({"extra_body": {"guided_json": {}}}, "guided_json"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content.0"),
])
def test_what_it_cannot_serve_is_refused_naming_the_field(client, kw, param):
    body = {"messages": [{"role": "user", "content": "hi"}], **GREEDY, **kw}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**body)
    assert err.value.status_code == 400 and err.value.body["param"] == param, err.value.body
