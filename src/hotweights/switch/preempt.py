"""A streamed request paused in flight and continued on its engine's next wake, seamless in the client's stream
(``preempt = true``). Torch-free.

Where memory forces a choice between busy engines, a turn ends (``schedule.room_for``) and the busy engine leaves:
by default its requests in flight finish first (an output of 512 tokens holds the GPU for 6-15 s on an H200). With
``preempt``, each streamed request it serves that can be continued is paused at an event's boundary: the front closes
its connection to the engine (vLLM aborts the request), keeps the client's stream open, and waits for the model
again, as a request of its own. On the engine's next wake it continues the answer token for token:

- the front asks every such request for its token ids (``return_token_ids``, vLLM's and the embedded engine's), and
  relays the events without them unless the client asked for them too;
- the continuation is a completion of the prompt's token ids followed by those generated so far (exact: nothing is
  tokenized again), its ``max_tokens`` and ``min_tokens`` less the tokens generated, with the request's sampling
  fields; a chat answer continues the same way, its events relayed as chat chunks;
- the continuation's events carry the first answer's ``id`` (and for chat its ``created``), and its usage (with
  ``stream_options.include_usage``) counts the prompt and the whole answer.

With ``temperature = 0`` the answer is the one an unpaused request gets (up to the numerics of a batch); sampled, it
is a sample of the same distribution (a ``seed`` is not resumed mid-stream).

A stream pauses only where every token relayed has had its text relayed (``Resumable.clean``): not in the middle
of a character's bytes, nor of a stop string the engine holds back. One asked before its first event (its prompt in
prefill, or queued on the engine behind others) is asked too, else a leaving engine waited for its whole answer (on
an H100, 6-7 s of a host-tier turn's end). Held, it pauses at once: its engine keeps what it computed, and where it
was queued it stays queued (held on its first event instead, one queued behind a full batch kept an H100's turn
waiting 6.9 s). Continued, it pauses once an event came since it last got its place (``Resumable.moved``): its
prompt's token ids on its first event, and after a continuation that continuation's first, so that a pause never
throws away a prefill it has not used.

Paused only: streamed, one choice (``n`` and ``best_of`` at most 1), without ``echo``, ``suffix``, logprobs, tools or
structured output (their state is not resumable); a chat answer that streams anything but content (reasoning, tool
calls) is not paused from then on. Any other request finishes in flight, as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
NOT_RESUMABLE = ("tools", "tool_choice", "functions", "response_format", "structured_outputs", "guided_json",
                 "guided_regex", "guided_choice", "guided_grammar", "echo", "suffix", "prompt_embeds", "logprobs",
                 "top_logprobs", "prompt_logprobs")
# a chat request's fields a completion of its token ids takes as they are (the sampling, the stops, the stream)
CARRIED = ("model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "logit_bias", "stop", "stop_token_ids", "seed", "ignore_eos", "skip_special_tokens",
           "spaces_between_special_tokens", "include_stop_str_in_output", "stream_options", "user", "priority",
           "bad_words", "allowed_token_ids")


@dataclass(eq=False)  # each one itself: held in its model's set of streams
class Resumable:
    """One streamed request that may be paused: the body as the client sent it, what has been relayed of its answer
    (text and token ids), and how to continue it."""

    path: str
    body: dict[str, Any]
    prompt_ids: list[int] | None = None  # the prompt's token ids, as the engine's first event gave them
    ids: list[int] = field(default_factory=list)  # the answer's token ids relayed so far
    finished: bool = False  # its finish_reason was relayed: nothing to continue
    other: bool = False  # a chat answer streamed reasoning or tool calls: not paused from then on
    first_id: str = ""  # the answer's id (and ``created``), kept by its continuations
    created: int = 0
    paused: int = 0  # how many times it was paused
    keep: bool = False  # its pause holds it on its engine with its KV cache (``Lifecycle.pause_streams``)
    before: int = 0  # tokens relayed before the continuation now streaming began
    pending: int = 0  # tokens relayed since the last text: their text is held back by the engine's detokenizer
    moved: bool = False  # an event came since it last got its place in flight (``can_pause``, continued)
    arrived: float = 0.0  # time.monotonic() its request came (with ``first_at`` and ``ids``: ``turns.token_due``)
    first_at: float = 0.0  # time.monotonic() its first byte was relayed, 0 before
    pause: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def chat(self) -> bool:
        return self.path == CHAT

    @property
    def wants_ids(self) -> bool:
        return self.body.get("return_token_ids") is True

    @property
    def may_pause(self) -> bool:
        """Whether it may pause, now or on its next event: one asked before an event came since it got its place
        (its prompt in prefill, or queued on the engine) pauses on it, not at its answer's end."""
        return not self.finished and not self.other

    @property
    def can_pause(self) -> bool:
        """Whether it may pause now: held anywhere (its engine keeps what it computed, nothing is sent again),
        continued once an event came since it got its place (its first brings its prompt's token ids)."""
        return self.may_pause and (self.keep or (self.moved and self.prompt_ids is not None))

    @property
    def clean(self) -> bool:
        """Whether every token relayed has had its text relayed: a pause waits for that. A detokenizer holds the
        text of a token back (bytes of a character not whole yet, the start of a stop string) and a continuation's
        detokenizer, primed with those tokens as its prompt, never gives it: vLLM 0.26's gave the whole prompt's
        text instead, where the prompt ended in bytes of a character not whole (its CPU build, a demo model)."""
        return self.pending == 0

    def first_body(self) -> bytes:
        """The request as the front sends it to the engine: its token ids asked for."""
        return json.dumps({**self.body, "return_token_ids": True}).encode()

    def relayed(self, event: bytes) -> bytes | None:
        """An event of the engine's answer (the first one, or a continuation) as its client gets it, counted here
        (None: not relayed)."""
        data = _data(event)
        if data is None:
            return event
        self.moved = True
        self.first_id, self.created = self.first_id or str(data.get("id", "")), self.created or data.get("created", 0)
        if self.prompt_ids is None:  # chat: on the answer; completions: on its choice
            given = data.get("prompt_token_ids") or next((c.get("prompt_token_ids") for c in data.get("choices") or ()
                                                          if c.get("prompt_token_ids")), None)
            self.prompt_ids = list(given) if given else None
        for choice in data.get("choices") or ():
            ids = choice.get("token_ids") or []
            self.ids += ids
            delta = choice.get("delta") or {}
            self.pending = 0 if choice.get("text") or delta.get("content") else self.pending + len(ids)
            self.other |= any(delta.get(k) for k in ("reasoning_content", "reasoning", "tool_calls"))
            self.finished |= bool(choice.get("finish_reason"))
        if self.paused:
            return _as_chat(self, data) if self.chat else self._continued(data)
        return event if self.wants_ids else _without_ids(data, self.chat)

    def _continued(self, data: dict[str, Any]) -> bytes | None:
        data["id"] = self.first_id
        for choice in data.get("choices") or ():
            choice["prompt_token_ids"] = None
            if not self.wants_ids:
                choice["token_ids"] = None
        _usage(self, data)
        return _event(data)

    def continuation(self) -> bytes:
        """The completion that continues the answer from the tokens relayed so far."""
        assert self.prompt_ids is not None, "paused only once its prompt's token ids came"
        done, self.before = len(self.ids), len(self.ids)
        body = dict(self.body) if not self.chat else {k: self.body[k] for k in CARRIED if k in self.body}
        limit = self.body.get("max_completion_tokens") or self.body.get("max_tokens")
        if limit is None and not self.chat:
            limit = 16  # the completions API's default
        body.pop("max_completion_tokens", None)
        body.update(prompt=self.prompt_ids + self.ids, max_tokens=None if limit is None else max(1, limit - done),
                    stream=True, return_token_ids=True)
        if self.body.get("min_tokens"):
            body["min_tokens"] = max(0, int(self.body["min_tokens"]) - done)
        return json.dumps(body).encode()


def _usage(r: Resumable, data: dict[str, Any]) -> None:
    usage = data.get("usage")
    if isinstance(usage, dict) and "completion_tokens" in usage:
        prompt = len(r.prompt_ids or ())
        completion = int(usage["completion_tokens"]) + r.before
        usage.update(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _as_chat(r: Resumable, data: dict[str, Any]) -> bytes | None:
    """A continuation's event (a completion's) as the chat chunk its client expects."""
    choices = []
    for c in data.get("choices") or ():
        choice = {"index": c.get("index", 0), "delta": {"content": c.get("text", "")} if c.get("text") else {},
                  "logprobs": None, "finish_reason": c.get("finish_reason")}
        if "stop_reason" in c:
            choice["stop_reason"] = c["stop_reason"]
        if r.wants_ids:
            choice["token_ids"] = c.get("token_ids")
        choices.append(choice)
    if choices and all(not c["delta"] and not c["finish_reason"] for c in choices) and not r.wants_ids:
        return None  # nothing for the client: an event that carried token ids only
    chunk = {"id": r.first_id, "object": "chat.completion.chunk", "created": r.created, "model": data.get("model"),
             "choices": choices}
    if "usage" in data:
        chunk["usage"] = data["usage"]
        _usage(r, chunk)
    return _event(chunk)


def _without_ids(data: dict[str, Any], chat: bool) -> bytes | None:
    """An event without the token ids the front asked for (as the engine sends it when not asked: null)."""
    if chat and "prompt_token_ids" in data:
        data["prompt_token_ids"] = None
    for choice in data.get("choices") or ():
        if "token_ids" in choice:
            choice["token_ids"] = None
        if "prompt_token_ids" in choice:
            choice["prompt_token_ids"] = None
    if chat and data.get("choices") and all(not (c.get("delta") or {}) and not c.get("finish_reason")
                                            for c in data["choices"]):
        return None  # vLLM sends an empty delta for token ids alone
    return _event(data)


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _data(event: bytes) -> dict[str, Any] | None:
    """The JSON of an event's ``data:`` line (None for ``[DONE]``, a comment or what is not an object)."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return None
            try:
                data = json.loads(payload)
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def resumable(path: str, body: bytes) -> Resumable | None:
    """The request as one that may be paused, or None where it may not (see the module's docstring)."""
    if path not in (COMPLETIONS, CHAT):
        return None
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or request.get("stream") is not True:
        return None
    if any(request.get(key) not in (None, False, []) for key in NOT_RESUMABLE):
        return None
    if any(request.get(key) not in (None, 1) for key in ("n", "best_of")):
        return None
    if path == COMPLETIONS and not isinstance(request.get("prompt"), (str, list)):
        return None
    if path == COMPLETIONS and isinstance(request["prompt"], list) and not all(isinstance(x, int)
                                                                               for x in request["prompt"]):
        return None  # several prompts (a list of strings, or of lists): several answers
    if path == CHAT and not (isinstance(request.get("messages"), list) and request["messages"]):
        return None
    return Resumable(path, request)


class Events:
    """A stream's bytes cut at its events' ends (a blank line): a pause never splits an event."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events that ``chunk`` completes, each with its blank line."""
        self._rest += chunk.replace(b"\r\n", b"\n")
        *whole, self._rest = self._rest.split(b"\n\n")
        return [e + b"\n\n" for e in whole]


def pause_all(streams: Iterable[Resumable], keep: bool = False) -> int:
    """Ask each of ``streams`` that may be paused to pause: each frees its place and waits for its model again,
    ``keep``: held on its connection while the engine parks keeping its KV cache, else its relay ended at an event's
    end, to be continued from its tokens. How many."""
    asked = [r for r in streams if r.may_pause and not r.pause.is_set()]
    for r in asked:
        r.keep = keep  # before the pause: the relay reads it once paused
        r.pause.set()
    return len(asked)
