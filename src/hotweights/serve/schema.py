"""Request bodies of the OpenAI-compatible endpoints (pydantic), validated on arrival.

What a greedy/sampling decoder can serve is served: prompts as text, token ids or lists of
either, chat content as a string or text parts, ``n``, ``echo``, penalties (vLLM's
``repetition_penalty`` too), ``top_k``, ``ignore_eos``, ``logit_bias``,
``stream_options.include_usage``, logprobs (completions: ``logprobs: k``; chat:
``logprobs: true`` with ``top_logprobs: k``; k at most 20, vLLM's default limit). What it cannot
(tools, structured output, the prompt's logprobs, images, ...) is refused with 400 naming the
field, and so is a field this server does not know: a request is never answered as if a field
it sent had been read. Fields common clients send that change nothing in the answer (``HARMLESS``:
OpenAI's ``store``, ``metadata``, ``service_tier``, ``reasoning_effort``, ``prompt_cache_key``,
``safety_identifier``; Ollama's ``keep_alive``, which ``hotweights switch`` maps onto the model's
idle timer) are accepted, and said at debug level.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
HARMLESS = ("store", "metadata", "service_tier", "reasoning_effort", "prompt_cache_key", "safety_identifier",
            "keep_alive")


class BadRequest(Exception):
    """A request that is well-formed but cannot be served: 400, or ``status`` (404: no such model)."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is refused, never ignored


class StreamOptions(Body):
    include_usage: bool = False  # a last chunk with the usage and no choices
    continuous_usage_stats: bool = False  # vLLM's; refused when true


class Sampling(Body):
    model: str | None = None
    max_tokens: int | None = Field(default=16, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the newer name; wins when given
    n: int = Field(default=1, ge=1, le=64)
    temperature: float | None = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float | None = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's; -1 and 0 mean off
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in -100..100
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # the caller's end-user id, for its own records; no effect on the answer
    return_token_ids: bool = False  # vLLM's: the prompt's token ids and each chunk's (``hotweights switch`` asks)
    repetition_penalty: float | None = Field(default=None, gt=0.0)  # vLLM's: > 1 discourages any token seen before
    ignore_eos: bool = False  # vLLM's: decode past the end-of-sequence token, up to max_tokens
    # sent by common clients, no effect on the answer here (``HARMLESS``): accepted, said at debug level
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None  # for reasoning models: these decode the answer only
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    keep_alive: str | int | float | None = None  # Ollama's (``hotweights switch`` reads it: the model's idle timer)
    # in the API, not served here: refused unless absent or off (``refuse_unserved``)
    best_of: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None

    def refuse_unserved(self) -> None:
        off = {"best_of": self.best_of in (None, 1, self.n), "tools": not self.tools,
               "tool_choice": self.tool_choice in (None, "none"), "functions": not self.functions,
               "function_call": self.function_call in (None, "none"),
               "response_format": self.response_format in (None, {"type": "text"})}
        for name, ok in off.items():
            if not ok:
                raise BadRequest(f"{name} is not supported by this server (it decodes text only: greedy or "
                                 f"sampled; no tools or structured output)", name)
        if self.stream_options is not None and not self.stream:
            raise BadRequest("stream_options is only allowed with stream=true", "stream_options")
        if self.stream_options is not None and self.stream_options.continuous_usage_stats:
            raise BadRequest("stream_options.continuous_usage_stats is not supported by this server (include_usage "
                             "is)", "stream_options.continuous_usage_stats")

    def top_logprobs_wanted(self) -> int | None:
        """How many of each step's most likely tokens to report with each token's logprob; None: no logprobs."""
        return None

    def harmless(self) -> list[str]:
        """The fields given that this server accepts and does not read (``HARMLESS``)."""
        return [name for name in HARMLESS if getattr(self, name) is not None]

    def bias(self, vocab_size: int) -> dict[int, float]:
        out: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab_size or not -100 <= value <= 100:
                raise BadRequest(f"logit_bias: {key!r}: {value} is not a token id in 0..{vocab_size - 1} with a "
                                 f"bias in -100..100", "logit_bias")
            out[int(key)] = value
        return out


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # the prompt's text before the completion's
    suffix: str | None = None  # refused when given: no fill-in-the-middle here
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def top_logprobs_wanted(self) -> int | None:
        if self.logprobs is not None and self.echo:
            raise BadRequest("logprobs with echo (the prompt's logprobs) is not supported by this server", "logprobs")
        return self.logprobs

    def prompts(self, vocab_size: int) -> list[str | list[int]]:
        """Each prompt, as text or as token ids (checked against the vocabulary)."""
        if self.suffix is not None:
            raise BadRequest("suffix is not supported by this server", "suffix")
        prompt = self.prompt
        items: list[str | list[int]] = [prompt] if isinstance(prompt, str) else (
            [prompt] if prompt and isinstance(prompt[0], int) else list(prompt))  # type: ignore[list-item]
        if not items or any(len(p) == 0 for p in items):
            raise BadRequest("prompt must not be empty", "prompt")
        for p in items:
            if isinstance(p, list) and not all(0 <= t < vocab_size for t in p):
                raise BadRequest(f"prompt holds a token id outside the vocabulary (0..{vocab_size - 1})", "prompt")
        return items


class Message(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None  # passed to the chat template with the message

    def text(self, where: str) -> str:
        """The content as one string: text parts joined; any other part is refused, naming it."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for j, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"content part of type {part.get('type')!r} is not supported by this server (text "
                                 f"parts only)", f"{where}.content.{j}")
            texts.append(part["text"])
        return "".join(texts)


class ChatRequest(Sampling):
    # no legacy default of 16: a chat completion may use the rest of the context, as OpenAI's and vLLM's do
    max_tokens: int | None = Field(default=None, ge=1)
    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def top_logprobs_wanted(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise BadRequest("top_logprobs needs logprobs=true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def dialog(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text(f"messages.{i}"), **({"name": m.name} if m.name else {})}
                for i, m in enumerate(self.messages)]
