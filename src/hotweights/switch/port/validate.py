"""What the front checks of a request before it may switch for it: the body is a JSON object, ``model`` is a
served model's name (absent: the default model, as vLLM serves its model), and the fields whose bounds every
engine shares (vLLM's ``SamplingParams`` checks and the embedded server's schema agree on these) are in them,
so that a request its engine would refuse never parks another model first.

Not covered: what only the engine knows (the prompt against its context length, fields one engine serves and
another refuses); those are the engine's answer, relayed. Unknown fields pass: the engine decides.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Refused(Exception):
    """A request the front answers itself (400, or 404 for a model it does not serve), naming the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # the engine reads the rest

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None


class _Completion(_Common):
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    logprobs: int | None = Field(default=None, ge=0)


class _Chat(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0)


class _Any(BaseModel):
    """Any other path an engine may serve (embeddings, responses, tokenize, ...): only its ``model`` is read."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None


BODIES: dict[str, type[BaseModel]] = {"/v1/completions": _Completion, "/v1/chat/completions": _Chat}
# every POST path the front relays to the engine of the body's model: vLLM's OpenAI-compatible JSON paths, its
# tokenizer's and its pooling models'. Never an engine's own control paths (/sleep, /wake_up, /pause,
# /collective_rpc, ...: the engines run with VLLM_SERVER_DEV_MODE=1 so that they park), which stay on loopback.
RELAYED = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/score", "/v1/rerank",
           "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/invocations")


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_of(body: bytes) -> float | None:
    """Ollama's ``keep_alive`` in ``body`` (a JSON object the front has read), in seconds: how long the model stays
    awake once idle; a number is seconds, a string a Go duration (``"5m"``, ``"1h30m"``, ``"500ms"``); negative:
    for ever (``inf``); None where it is absent. Refused (400) where it is neither."""
    if b'"keep_alive"' not in body:  # most bodies: not parsed a second time on the way to the engine
        return None
    try:
        value = json.loads(body).get("keep_alive")
    except (ValueError, AttributeError):
        return None
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (text := value.strip()):
        sign, text = (-1.0, text[1:]) if text[0] == "-" else (1.0, text.lstrip("+"))
        try:
            seconds = sign * float(text)  # a plain number, as a string
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise Refused(f"keep_alive must be seconds or a duration such as \"5m\" or \"1h30m\", got "
                              f"{value!r}", "keep_alive") from None
            seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise Refused(f"keep_alive must be seconds or a duration such as \"5m\", got {value!r}", "keep_alive")
    return float("inf") if seconds < 0 else seconds


def model_of(path: str, body: bytes, served: dict[str, Any], default: str) -> str:
    """The served model ``body`` asks for at ``path``; Refused when the front can tell it would be refused."""
    try:
        request = BODIES.get(path, _Any).model_validate_json(body)
    except ValidationError as exc:
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {}
        if str(first.get("type", "")).startswith("json"):  # where the parse stopped, as a client can act on it
            raise Refused(f"the body must be a JSON object (the request's fields): {first.get('msg', '')}") from None
        if first.get("type") == "model_type":
            raise Refused("the body must be a JSON object (the request's fields)") from None
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise Refused(f"invalid request: {param + ': ' if param else ''}{first.get('msg', 'bad value')}",
                      param) from None
    model = getattr(request, "model", None)
    if model is None:
        return default
    if model not in served:
        raise Refused(f"The model `{model}` does not exist. Valid models: {', '.join(served)}.", "model", status=404)
    return str(model)
