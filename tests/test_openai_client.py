"""The official ``openai`` Python client (pinned in the test extra) against the embedded server.

What clients send is served (content parts, prompt lists, token ids, n, echo, usage in a stream,
logit bias, top_k); what the server cannot serve is refused with the client's own exception,
naming the field, never ignored. Run: pytest tests/test_openai_client.py
"""

from __future__ import annotations

import json
import urllib.error
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
    assert err.value.body["type"] == "NotFoundError" and err.value.body["code"] == 404  # vLLM's values
    assert err.value.body["message"] == "The model `gpt-4o` does not exist. Valid aliases: tiny."


def test_every_error_is_json_in_vllms_shape(warm_server):
    for method, path, status, kind in (("GET", "/v1/models/tiny", 404, "Not Found"),
                                       ("GET", "/v1/completions", 405, "Method Not Allowed")):
        req = urllib.request.Request(warm_server.url + path, method=method)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == status
        assert json.loads(err.value.read()) == {"error": {"message": kind, "type": kind, "param": None,
                                                          "code": status}}


def test_completion_logprobs_are_each_tokens_with_the_steps_most_likely(client):
    reply = client.completions.create(prompt="ab", logprobs=3, **GREEDY)
    lp, n = reply.choices[0].logprobs, reply.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) in (n, n + 1)  # a last end-of-sequence token is reported too, as vLLM does
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # keyed by text: byte tokens that decode alike (U+FFFD) share a key, so up to k + 1 keys
        assert logprob <= 0 and top[token] == logprob and 1 <= len(top) <= 4
        assert logprob >= max(top.values()) - 1e-5  # greedy: the chosen token is the most likely one
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert client.completions.create(prompt="ab", logprobs=3, **GREEDY).choices[0].logprobs == lp
    streamed = list(client.completions.create(prompt="ab", logprobs=3, stream=True, **GREEDY))
    assert [t for c in streamed for t in c.choices[0].logprobs.token_logprobs] == lp.token_logprobs
    assert [o for c in streamed for o in c.choices[0].logprobs.text_offset] == lp.text_offset


def test_chat_logprobs_carry_bytes_and_top_logprobs(client):
    reply = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], logprobs=True,
                                           top_logprobs=2, **GREEDY)
    content = reply.choices[0].logprobs.content
    assert len(content) in (reply.usage.completion_tokens, reply.usage.completion_tokens + 1)
    for entry in content:
        assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 2
        assert abs(entry.logprob - entry.top_logprobs[0].logprob) < 1e-5
    plain = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **GREEDY)
    assert plain.choices[0].logprobs is None and plain.choices[0].message == reply.choices[0].message


def test_a_stream_sends_one_chunk_per_token_and_a_chat_stream_names_the_role_first(client):
    whole = client.completions.create(prompt="ab", **GREEDY)
    chunks = list(client.completions.create(prompt="ab", stream=True, **GREEDY))
    extra = 1 if whole.choices[0].finish_reason == "stop" else 0  # the end-of-sequence step
    assert len(chunks) == whole.usage.completion_tokens + extra
    chat = list(client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], stream=True, **GREEDY))
    assert chat[0].choices[0].delta.role == "assistant" and chat[0].choices[0].delta.content == ""
    assert chat[-1].choices[0].finish_reason in ("stop", "length") and len(chat) >= 2


def test_an_answer_ending_inside_a_utf8_character_holds_its_bytes_back(client):
    """The byte-level demo tokenizer: forcing byte 0xE2 (the first of a 3-byte character) as the only token."""
    forced = {"prompt": "ab", "model": "tiny", "max_tokens": 1, "temperature": 0, "logit_bias": {"226": 100}}
    reply = client.completions.create(**forced)
    assert reply.usage.completion_tokens == 1 and reply.choices[0].text == ""  # not U+FFFD, as vLLM does
    assert "".join(c.choices[0].text for c in client.completions.create(stream=True, **forced)) == ""


@pytest.mark.parametrize("kw, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs=true
    ({"extra_body": {"guided_json": {}}}, "guided_json"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content.0"),
])
def test_what_it_cannot_serve_is_refused_naming_the_field(client, kw, param):
    body = {"messages": [{"role": "user", "content": "hi"}], **GREEDY, **kw}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**body)
    assert err.value.status_code == 400 and err.value.body["param"] == param, err.value.body


def test_fields_common_clients_send_are_accepted_and_vllms_repetition_penalty_and_ignore_eos_served(client):
    """Issue 68: fields that change nothing in the answer (OpenAI's ``store``, ``metadata``, ``service_tier``,
    ``reasoning_effort``, ..., Ollama's ``keep_alive``) were answered 400; vLLM's ``repetition_penalty`` and
    ``ignore_eos``, which vLLM serves, too. Those that would change the answer and are not served still are."""
    harmless = {"store": True, "metadata": {"app": "x"}, "service_tier": "auto", "reasoning_effort": "low",
                "prompt_cache_key": "k", "safety_identifier": "u", "keep_alive": "5m"}
    assert chat_text(client, "hi", extra_body=harmless) == chat_text(client, "hi")  # accepted, the same answer
    eos = {"258": 100}  # the demo tokenizer's end of sequence, made the greedy choice
    stopped = client.completions.create(prompt="ab", logit_bias=eos, **GREEDY)
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 0
    kept = client.completions.create(prompt="ab", logit_bias=eos, extra_body={"ignore_eos": True}, **GREEDY)
    assert kept.choices[0].finish_reason == "length" and kept.usage.completion_tokens == GREEDY["max_tokens"]
    forced = {str(ord("z")): 100, str(ord("y")): 50}  # "z" every step, unless a token seen before is penalized
    assert client.completions.create(prompt="ab", logit_bias=forced, **GREEDY).choices[0].text == "z" * 8
    same = client.completions.create(prompt="ab", logit_bias=forced, extra_body={"repetition_penalty": 1.0}, **GREEDY)
    assert same.choices[0].text == "z" * 8  # 1: off
    penal = client.completions.create(prompt="ab", logit_bias=forced, extra_body={"repetition_penalty": 1e6},
                                      **GREEDY).choices[0].text
    assert penal.startswith("zy"), penal  # z, once seen, has its logit divided: y goes next
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(prompt="ab", extra_body={"repetition_penalty": 0}, **GREEDY)
    assert err.value.body["param"] == "repetition_penalty"
