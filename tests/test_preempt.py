"""Pausing a streamed request and continuing it (``switch/preempt.py``, ``streams.relay_resumable``): which requests
may be paused, the events cut at their ends, the continuation's body for completions and chat, and the
continuation's events as the client gets them (one id, the usage over the whole answer, no second opening chunk);
then a real front with two embedded engines on the CPU, one at a time (``--max-awake 1 --preempt``): a long stream
paused for the other model's request arrives whole and the same as unpaused, the other answered while it waits; a
client that leaves while its stream is paused gives its place back.

Run: pytest tests/test_preempt.py
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from switch_front import Front, private_keeper, wait_started

from hotweights.switch.preempt import CHAT, COMPLETIONS, Events, resumable


def body(**fields) -> bytes:
    return json.dumps({"model": "a", "stream": True, **fields}).encode()


def event(data: dict | str) -> bytes:
    return b"data: " + (data if isinstance(data, str) else json.dumps(data)).encode() + b"\n\n"


def test_only_streams_of_one_choice_that_can_be_continued_may_be_paused():
    prompt, messages = {"prompt": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}
    assert resumable(COMPLETIONS, body(**prompt)) is not None
    assert resumable(COMPLETIONS, body(prompt=[1, 2, 3])) is not None  # token ids: one prompt
    assert resumable(CHAT, body(**messages)) is not None
    assert resumable(COMPLETIONS, json.dumps({"prompt": "hi"}).encode()) is None  # not streamed
    for refused in ({"n": 2}, {"best_of": 3}, {"echo": True}, {"suffix": "x"}, {"prompt": ["a", "b"]},
                    {"prompt": [[1], [2]]}, {"logprobs": 2}):
        assert resumable(COMPLETIONS, body(**{**prompt, **refused})) is None, refused
    for refused in ({"tools": [{"type": "function"}]}, {"response_format": {"type": "json_object"}}, {"messages": []},
                    {"logprobs": True}):
        assert resumable(CHAT, body(**{**messages, **refused})) is None, refused
    assert resumable("/v1/embeddings", body(input="x")) is None
    assert resumable(COMPLETIONS, b"not json") is None
    assert resumable(COMPLETIONS, body(prompt="hi", n=1, tools=[])) is not None  # what is empty or 1 is none
    assert json.loads(resumable(COMPLETIONS, body(**prompt)).first_body())["return_token_ids"] is True


def test_events_are_cut_at_their_blank_lines_whatever_the_chunks():
    events = Events()
    assert events.feed(b"data: {\"a\"") == []
    assert events.feed(b": 1}\n\ndata: [DO") == [b"data: {\"a\": 1}\n\n"]
    assert events.feed(b"NE]\r\n\r\n") == [b"data: [DONE]\n\n"]


def completion(text: str, ids: list[int], finish=None, **choice) -> bytes:
    return event({"id": "cmpl-1", "created": 7, "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                                             "token_ids": ids, **choice}]})


def test_a_completion_continues_from_its_prompts_token_ids_and_those_it_generated():
    r = resumable(COMPLETIONS, body(prompt="The cache", max_tokens=10, min_tokens=4, temperature=0))
    out = json.loads(r.relayed(completion(" keeps", [11], prompt_token_ids=[1, 2]))[5:])
    assert out["choices"][0]["token_ids"] is None and out["choices"][0]["prompt_token_ids"] is None  # not asked
    r.relayed(completion(" the", [12]))
    assert (r.prompt_ids, r.ids, r.finished, r.first_id, r.can_pause) == ([1, 2], [11, 12], False, "cmpl-1", True)
    r.paused = 1
    again = json.loads(r.continuation())
    assert again["prompt"] == [1, 2, 11, 12] and again["max_tokens"] == 8 and again["min_tokens"] == 2
    assert again["temperature"] == 0 and again["stream"] is True and again["return_token_ids"] is True
    cont = json.loads(r.relayed(event({"id": "cmpl-2", "choices": [{"index": 0, "text": " way", "token_ids": [13],
                                                                    "prompt_token_ids": [1, 2, 11, 12]}]}))[5:])
    assert cont["id"] == "cmpl-1" and cont["choices"][0]["prompt_token_ids"] is None and r.ids == [11, 12, 13]
    usage = {"id": "cmpl-2", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}}
    out = json.loads(r.relayed(event(usage))[5:])  # the continuation's usage, over the whole answer
    assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}
    assert r.relayed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    r.relayed(completion(".", [14], "length"))
    assert r.finished and not r.can_pause
    plain = resumable(COMPLETIONS, body(prompt="x"))
    plain.relayed(completion("y", [5], prompt_token_ids=[9]))
    assert json.loads(plain.continuation())["max_tokens"] == 15  # the API's default of 16, less one sent
    asked = resumable(COMPLETIONS, body(prompt="x", return_token_ids=True))
    raw = completion("y", [5], prompt_token_ids=[9])
    assert asked.relayed(raw) == raw  # asked for: relayed byte for byte


def test_a_stream_asked_before_its_first_event_pauses_on_it():
    """Issue 69, from an H100 run: a leaving engine waited 6-7 s for streams that had no first event when it left
    (their prompt in prefill, or queued behind others), whose whole answers came first. Such a stream is asked too:
    held, it pauses at once (its engine keeps what it computed; held on its first event, one queued behind a full
    batch kept an H100's turn waiting 6.9 s); continued, once an event came since it last got its place (its first
    brings its prompt's token ids; a continuation's first, so that no pause throws away an unused prefill)."""
    from hotweights.switch.preempt import pause_all

    early = resumable(COMPLETIONS, body(prompt="x", max_tokens=50))
    assert early.may_pause and not early.can_pause  # no prompt token ids yet: nothing to continue from
    assert pause_all([early]) == 1 and early.pause.is_set()
    early.relayed(completion("y", [5], prompt_token_ids=[9]))
    assert early.can_pause  # its first event: it pauses on it
    held = resumable(COMPLETIONS, body(prompt="x", max_tokens=50))
    assert pause_all([held], keep=True) == 1 and held.can_pause  # held: at once
    early.moved = False  # its continuation got its place (its engine woke): it goes on to that one's first event
    assert not early.can_pause
    early.relayed(completion("z", [6]))
    assert early.can_pause
    done = resumable(COMPLETIONS, body(prompt="x", max_tokens=50))
    done.relayed(completion("y", [5], "length", prompt_token_ids=[9]))
    assert pause_all([done]) == 0 and not done.may_pause


def test_a_stream_pauses_only_where_every_token_relayed_has_its_text():
    """A detokenizer holds a token's text back (a character's bytes not whole yet, a stop string's start); the
    continuation's, primed with those tokens as its prompt, never gives it (vLLM 0.26's gave the prompt's whole text
    instead). So a pause waits for the held text."""
    r = resumable(COMPLETIONS, body(prompt="x", max_tokens=50))
    r.relayed(completion("S", [83], prompt_token_ids=[9]))
    assert r.clean and r.can_pause
    r.relayed(completion("", [214]))
    r.relayed(completion("", [214]))
    assert not r.clean and r.pending == 2 and r.can_pause  # two bytes of a character: no pause here
    r.relayed(completion("\u00d6\u00d6", [159]))
    assert r.clean
    chat = resumable(CHAT, body(messages=[{"role": "user", "content": "hi"}], max_tokens=9))
    chat.relayed(event({"prompt_token_ids": [1], "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                              "token_ids": []}]}))
    chat.relayed(event({"choices": [{"index": 0, "delta": {}, "token_ids": [7]}]}))
    assert not chat.clean
    chat.relayed(event({"choices": [{"index": 0, "delta": {"content": "é"}, "token_ids": [8]}]}))
    assert chat.clean


def test_a_chat_answer_continues_as_a_completion_relayed_as_chat_chunks():
    r = resumable(CHAT, body(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=9, top_k=3,
                             stream_options={"include_usage": True}))
    opening = {"id": "chat-1", "created": 5, "prompt_token_ids": [7, 8],
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert json.loads(r.relayed(event(opening))[5:])["prompt_token_ids"] is None
    r.relayed(event({"id": "chat-1", "choices": [{"index": 0, "delta": {"content": "Hel"}, "token_ids": [20]}]}))
    assert r.relayed(event({"id": "chat-1", "choices": [{"index": 0, "delta": {}, "token_ids": [21]}]})) is None
    r.paused = 1
    again = json.loads(r.continuation())
    assert again["prompt"] == [7, 8, 20, 21] and again["max_tokens"] == 7 and again["top_k"] == 3
    assert "messages" not in again and "max_completion_tokens" not in again and again["stream_options"]
    out = json.loads(r.relayed(completion("lo", [22], prompt_token_ids=[7, 8, 20, 21]))[5:])
    assert out == {"id": "chat-1", "object": "chat.completion.chunk", "created": 5, "model": None,
                   "choices": [{"index": 0, "delta": {"content": "lo"}, "logprobs": None, "finish_reason": None}]}
    usage = json.loads(r.relayed(event({"id": "x", "choices": [], "usage": {"prompt_tokens": 4,
                                                                         "completion_tokens": 1}}))[5:])["usage"]
    assert usage == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    thinking = resumable(CHAT, body(messages=[{"role": "user", "content": "hi"}]))
    thinking.relayed(event({"prompt_token_ids": [1], "choices": [{"delta": {"reasoning_content": "hm"}}]}))
    assert not thinking.can_pause  # reasoning streamed: it finishes in flight


def interleaved(client, ask: dict, other_after_s: float, chat: bool, queued: dict | None = None
                ) -> tuple[list, float, float]:
    """``ask`` streamed on ``a`` while ``b`` is asked ``other_after_s`` later: the chunks, when the stream ended and
    when ``b`` was answered. With ``queued`` (a dict), ``ask`` streamed twice at once: the embedded engine runs one
    at a time, so one waits on it, without a first event, when ``a`` leaves for ``b``; its chunks and end there."""
    got: dict[str, float] = {}
    create = client.chat.completions.create if chat else client.completions.create

    def other() -> None:
        time.sleep(other_after_s)
        client.completions.create(model="b", prompt="x", max_tokens=2, temperature=0)
        got["b"] = time.monotonic()

    def twice() -> None:
        queued["chunks"] = list(create(**ask, stream=True, stream_options={"include_usage": True}))
        queued["ended"] = time.monotonic()

    threads = [threading.Thread(target=other), *([threading.Thread(target=twice)] if queued is not None else [])]
    for thread in threads:
        thread.start()
    chunks = list(create(**ask, stream=True, stream_options={"include_usage": True}))
    ended = time.monotonic()
    for thread in threads:
        thread.join()
    return chunks, ended, got["b"]


@pytest.mark.slow
def test_a_stream_paused_for_another_models_turn_arrives_whole_and_the_same(tmp_path):
    """One engine at a time (``--max-awake 1``) and ``--preempt``: a stream on ``a`` is paused when ``b``'s
    request has waited its turn, ``b`` is answered, and ``a``'s stream continues on ``a``'s next wake. Its client
    reads one stream: the same greedy text as unpaused (a completion, then a chat answer), one id, and the usage of
    the whole answer. A second stream on ``a``, queued behind the first on the engine (no first event when ``a``
    leaves), pauses on its first event, not at its answer's end, and arrives the same too."""
    from hotweights.demo_model import write_demo_model

    models = {"a": write_demo_model(tmp_path / "a", "tiny"), "b": write_demo_model(tmp_path / "b", "tiny", seed=1)}
    with private_keeper("hwpre-") as sock:
        # streams of ~1.5 s here: with 480 tokens (0.3 s) under CI's load b's request came after the chat's end
        # --no-keep-kv: continued by a new request from its token ids, as before issue 69 (the embedded engine's park
        # would keep it: the test after this one)
        f = wait_started(Front(tmp_path, models, "--max-awake", "1", "--preempt", "--no-keep-kv", "--turn-s", "0.1",
                               socket_dir=sock, engine_args=("--max-model-len", "2048")))
        try:
            client = f.client()
            ask = {"model": "a", "prompt": "The weight cache", "max_tokens": 1800, "temperature": 0}
            began = time.monotonic()
            unpaused = client.completions.create(**ask)
            plain, plain_tokens = unpaused.choices[0].text, unpaused.usage.completion_tokens
            alone_s = time.monotonic() - began
            queued: dict = {}
            chunks, ended, b_done = interleaved(client, ask, min(1.0, alone_s / 5), chat=False, queued=queued)
            talk = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1700,
                    "temperature": 0}
            answered = client.chat.completions.create(**talk)
            said, said_tokens = answered.choices[0].message.content, answered.usage.completion_tokens
            chat, chat_ended, chat_b_done = interleaved(client, talk, min(1.0, alone_s / 5), chat=True)
        finally:
            f.interrupt()
    log = f.log.read_text()
    assert log.count("a: a stream paused after") >= 2 and "leaves for b" in log, log[-3000:]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain  # greedy: token for token
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[-1].usage.completion_tokens == plain_tokens
    assert chunks[-1].usage.prompt_tokens == len("The weight cache")  # byte-level: a token a byte
    assert b_done < ended and chat_b_done < chat_ended, (alone_s, log[-3000:])  # b answered during the pauses
    # the stream queued behind it, with no first event when a left: paused on that event, not finished first
    assert "".join(c.choices[0].text for c in queued["chunks"] if c.choices) == plain
    assert b_done < queued["ended"], (alone_s, log[-3000:])
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices) == said
    assert {c.id for c in chat} == {chat[0].id} and chat[-1].usage.completion_tokens == said_tokens
    assert sum(1 for c in chat if c.choices and c.choices[0].delta.role) == 1  # one opening chunk
    assert "tokens, paused 1 time(s)" in log
    # each stream's window from its place to joining its model's streams (a leave in it does not pause it)
    assert re.search(r"paused 1 time\(s\), joined \d+\.\d{3} s after its place", log), log[-3000:]


def prompt_tokens(port: int) -> float:
    """What an embedded engine counted of prompts it computed (its ``/metrics``)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith("hotweights_server_prompt_tokens_total"))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [(), ("--schedule", "deadline", "--slo-ttft-s", "0.3")], ids=["fair", "deadline"])
def test_a_host_tier_stream_held_across_its_engines_park_goes_on_with_nothing_computed_again(tmp_path, schedule):
    """Issue 69 on the CPU: one engine at a time, every model on the host tier (``--parked-weights host``: a park
    unmaps the weights and the keeper keeps only their host copy), ``--preempt``. A stream on ``a`` is held when
    ``b``'s request has waited its turn: ``a``'s engine parks with the generation paused and its KV cache kept, ``b``
    is answered, ``a`` wakes (its weights mapped back) and the stream goes on from where it stopped. The client reads
    the same greedy text as unpaused, and ``a``'s engine computed its prompt once (its counter), not again. The same
    with the deadline schedule (issue 69, part 2: ``b``'s first token due 0.3 s after its request ends ``a``'s turn;
    ``a``'s held stream, due by its token deadline, goes first once ``b`` is served). A second stream queued behind
    the first on ``a``'s engine is held too, before its first event, and goes on the same."""
    from hotweights.demo_model import write_demo_model

    models = {"a": write_demo_model(tmp_path / "a", "tiny"), "b": write_demo_model(tmp_path / "b", "tiny", seed=1)}
    with private_keeper("hwkv-") as sock:
        f = wait_started(Front(tmp_path, models, "--max-awake", "1", "--preempt", "--turn-s", "0.1", *schedule,
                               "--parked-weights", "host", socket_dir=sock, engine_args=("--max-model-len", "2048")))
        try:
            client = f.client()
            ask = {"model": "a", "prompt": "The weight cache", "max_tokens": 1800, "temperature": 0}
            began = time.monotonic()
            unpaused = client.completions.create(**ask)
            plain, alone_s = unpaused.choices[0].text, time.monotonic() - began
            port = f.state("a")["port"]
            counted = prompt_tokens(port)
            queued: dict = {}
            chunks, ended, b_done = interleaved(client, ask, min(1.0, alone_s / 5), chat=False, queued=queued)
            after = prompt_tokens(f.state("a")["port"])
            same_engine = f.state("a")["port"] == port
        finally:
            f.interrupt()
    log = f.log.read_text()
    assert "a: a stream held after" in log and "leaves for b" in log and "paused after" not in log, log[-3000:]
    assert re.search(r"switch: a (deep-parked|parked) for b once its requests ended, .*to host memory", log), log
    assert b_done < ended and b_done < queued["ended"], (alone_s, log[-3000:])  # b answered while a's were held
    for got in (chunks, queued["chunks"]):  # the one queued behind it, not begun when a left, held as it was
        assert "".join(c.choices[0].text for c in got if c.choices) == plain  # greedy: token for token
        assert {c.id for c in got} == {got[0].id} and got[-1].usage.completion_tokens == 1800
    assert same_engine and after - counted == 2 * len("The weight cache")  # each prompt once: none computed again


@pytest.mark.slow
def test_a_client_that_leaves_while_its_stream_is_paused_gives_its_place_back(tmp_path):
    """A paused stream waits for its model as a request of its own: its client leaving then is a request given up
    (the ledger's ``gone``), not a place held for nobody. ``b``'s streams, busy enough to hold the turn, finish whole,
    and ``a`` answers the next request."""
    import httpx

    from hotweights.demo_model import write_demo_model

    models = {"a": write_demo_model(tmp_path / "a", "tiny"), "b": write_demo_model(tmp_path / "b", "tiny", seed=1)}
    with private_keeper("hwpre-") as sock:
        f = wait_started(Front(tmp_path, models, "--max-awake", "1", "--preempt", "--turn-s", "0.1", socket_dir=sock,
                               engine_args=("--max-model-len", "512")))
        try:
            long = {"prompt": "The weight cache", "max_tokens": 480, "temperature": 0, "stream": True}
            ends: list[str] = []
            go = threading.Event()

            def b_stream(client: httpx.Client) -> None:
                go.wait(60)
                with client.stream("POST", f.url + "/v1/completions", json={"model": "b", **long}) as r:
                    ends.extend(line for line in r.iter_lines() if '"finish_reason":"length"' in
                                line.replace(" ", ""))

            # b's threads and clients ready beforehand: a's 480 tiny-model tokens take ~0.5 s, and threads started
            # only once a's first byte came sent their requests ~0.3 s later on a busy machine, after a had ended
            clients = [httpx.Client(timeout=120) for _ in range(6)]
            others = [threading.Thread(target=b_stream, args=(c,)) for c in clients]
            for t in others:
                t.start()
            with httpx.stream("POST", f.url + "/v1/completions", json={"model": "a", **long}, timeout=120) as r:
                lines = r.iter_lines()
                next(lines)  # a's answer is under way
                go.set()
                deadline = time.monotonic() + 30
                while not (f.state("a")["waiting"] and f.state("a")["state"] != "awake"):  # paused, waiting for a
                    assert time.monotonic() < deadline, f.log.read_text()[-3000:]
                    time.sleep(0.01)
            # the client of a is gone, its stream paused
            deadline = time.monotonic() + 10
            while f.state("a")["waiting"] or f.state("a")["inflight"]:
                assert time.monotonic() < deadline, (f.status(), f.log.read_text()[-3000:])
                time.sleep(0.05)
            for t in others:
                t.join(120)
            for c in clients:
                c.close()
            got = f.client().completions.create(model="a", prompt="x", max_tokens=4, temperature=0)
            rows = {m["name"]: m for m in f.status()["models"]}
        finally:
            f.interrupt()
    assert len(ends) == 6  # every one of b's streams ended whole
    assert got.choices[0].finish_reason == "length" and rows["a"]["inflight"] == rows["b"]["inflight"] == 0
    assert "a: a stream held after" in f.log.read_text()  # the embedded engine's park keeps it (keep_kv)
