"""Request bodies of the OpenAI-compatible endpoints (pydantic), validated on arrival."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BadRequest(Exception):
    """A request that is well-formed but cannot be served; answered with 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send fields we do not use
    model: str | None = None
    max_tokens: int | None = Field(default=16, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the newer name; wins when given
    logprobs: bool | int | None = None  # not implemented: any truthy value is refused with 400
    top_logprobs: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: int = 1


class CompletionRequest(Sampling):
    prompt: str | list[str]


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(Sampling):
    # no legacy default of 16: a chat completion may use the rest of the context, as OpenAI's and vLLM's do
    max_tokens: int | None = Field(default=None, ge=1)
    messages: list[Message] = Field(min_length=1)
