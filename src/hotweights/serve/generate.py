"""Token generation for the embedded server: incremental decoding with a KV cache.

Greedy decoding (temperature 0) is deterministic; sampling uses a generator seeded
per request. Text is streamed as it becomes printable: a byte-level tokenizer can end
a step in the middle of a UTF-8 character, so a trailing U+FFFD is held back.

Not covered: batching several requests (one generation at a time, behind a lock),
beam search, logprobs.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str  # new text since the previous chunk
    finish_reason: str | None = None  # "stop" | "length" on the last chunk
    num_tokens: int = 0  # tokens generated so far (final on the last chunk)


class Generator:
    def __init__(self, model, tokenizer, *, max_model_len: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.device = next(model.parameters()).device
        self.lock = threading.Lock()
        # transformers >= 5.2x names the KV cache argument and output field "cache"
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt, add_special_tokens=False).input_ids

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        """Chunks of new text; the last one carries the finish reason."""
        with self.lock, torch.inference_mode():
            yield from self._stream(prompt_ids, params)

    def _stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        gen = None
        if params.temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        ids = torch.tensor([prompt_ids], device=self.device)
        past = None
        out: list[int] = []
        sent = ""
        for _ in range(params.max_tokens):
            result = self.model(input_ids=ids, use_cache=True, **{self.cache_arg: past})
            past = getattr(result, self.cache_arg)
            token = self._pick(result.logits[0, -1].float(), params, gen)
            if token in self.eos_ids:
                yield Chunk("", "stop", len(out))
                return
            out.append(token)
            text = self.tokenizer.decode(out, skip_special_tokens=True)
            hit = _find_stop(text, params.stop)
            if hit is not None:
                yield Chunk(text[len(sent):hit], "stop", len(out))
                return
            if len(text) > len(sent) and not text.endswith("\ufffd"):
                yield Chunk(text[len(sent):], None, len(out))
                sent = text
            ids = torch.tensor([[token]], device=self.device)
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        yield Chunk(text[len(sent):], "length", len(out))

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
        if params.temperature <= 0 or gen is None:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=gen))


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None
