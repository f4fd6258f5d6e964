"""Token generation for the embedded server: incremental decoding with a KV cache.

Greedy decoding (temperature 0) is deterministic; sampling uses a generator seeded
per request. Logit bias and the presence/frequency penalties (OpenAI's definitions) change the
logits before either; ``top_k`` and ``top_p`` narrow sampling only. One chunk per generated token,
as vLLM streams: its text is what became printable (a byte-level tokenizer can end a step in the
middle of a UTF-8 character: trailing U+FFFD is held back, and never shown if the answer ends there,
as vLLM does). With ``logprobs`` set, each chunk carries its token's log-probability and the
``logprobs`` most likely tokens of that step, from the model's own logits (before bias, penalties
and temperature: vLLM's default ``raw_logprobs``).

Not thread-safe: one caller at a time (the server's engine thread, ``engine.py``). ``should_stop``
is asked before every decoding step, so a caller that gave up ends the generation within one step.

Not covered: batching several requests, beam search, prompt logprobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_k: int = 0  # 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # None: none; k >= 0: each token's and the k most likely ones'
    repetition_penalty: float = 1.0  # vLLM's: a token of the prompt or the output so far has its logit divided by it
    # (multiplied where negative); 1: off
    ignore_eos: bool = False  # an end-of-sequence token does not end the answer: it runs to max_tokens


@dataclass(frozen=True, slots=True)
class Logprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the step's most likely tokens, most likely first


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str  # new text since the previous chunk
    finish_reason: str | None = None  # "stop" | "length" on the last chunk
    num_tokens: int = 0  # tokens generated so far (final on the last chunk)
    logprobs: tuple[Logprob, ...] = ()  # this chunk's token (asked for with SamplingParams.logprobs)
    token_ids: tuple[int, ...] = ()  # this chunk's token (vLLM's ``return_token_ids``; the end of text's too)


# ``step(ids [1, n], past) -> (logits of the last position [vocab], past)``
Step = Callable[[torch.Tensor, object], tuple[torch.Tensor, object]]


def step_of(model) -> Step:
    """The model's ``step``: its own (the native decoder), or one around a transformers causal LM."""
    if hasattr(model, "step"):
        return model.step
    import inspect

    # transformers >= 5.2x names the KV cache argument and output field "cache"
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def step(ids: torch.Tensor, past):
        result = model(input_ids=ids, use_cache=True, **{cache_arg: past})
        return result.logits[0, -1], getattr(result, cache_arg)

    return step


class Generator:
    def __init__(self, model, tokenizer, *, max_model_len: int, eos_ids: set[int], vocab_size: int) -> None:
        self.model = model  # a park unmaps its weights and a wake puts them back (park.py)
        self.step = step_of(model)
        self.tokenizer = tokenizer  # serve.tokenizer.Tokenizer
        self.max_model_len = max_model_len
        self.device = next(model.parameters()).device
        self.eos_ids = eos_ids
        self.vocab_size = vocab_size  # the model's (config.json): what a token id may be

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def stream(self, prompt_ids: list[int], params: SamplingParams, *,
               should_stop: Callable[[], bool] = lambda: False) -> Iterator[Chunk]:
        """Chunks of new text; the last one carries the finish reason (none when ``should_stop`` ended it)."""
        with torch.inference_mode():
            yield from self._stream(prompt_ids, params, should_stop)

    def _stream(self, prompt_ids: list[int], params: SamplingParams,
                should_stop: Callable[[], bool]) -> Iterator[Chunk]:
        gen = None
        if params.temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        ids = torch.tensor([prompt_ids], device=self.device)
        past = None
        out: list[int] = []
        sent = ""
        for n in range(1, params.max_tokens + 1):
            if should_stop():
                return
            logits, past = self.step(ids, past)
            token = self._pick(_adjusted(logits.float(), params, out, prompt_ids), params, gen)
            scored = () if params.logprobs is None else (_logprob(logits, token, params.logprobs),)
            if token in self.eos_ids and not params.ignore_eos:
                yield Chunk("", "stop", len(out), scored, (token,))
                return
            out.append(token)
            text = self.tokenizer.decode(out)
            hit = _find_stop(text, params.stop)
            if hit is not None:
                yield Chunk(text[len(sent):hit], "stop", len(out), scored, (token,))
                return
            shown = text.rstrip("\ufffd")  # an incomplete UTF-8 character: held back until it completes
            new = shown[len(sent):] if len(shown) > len(sent) else ""
            yield Chunk(new, "length" if n == params.max_tokens else None, len(out), scored, (token,))
            sent = shown if new else sent
            ids = torch.tensor([[token]], device=self.device)

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
        if params.temperature <= 0 or gen is None:
            return int(torch.argmax(logits))
        if 0 < params.top_k < logits.numel():
            logits = logits.masked_fill(logits < torch.topk(logits, params.top_k).values[-1], float("-inf"))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=gen))


def _adjusted(logits: torch.Tensor, params: SamplingParams, out: list[int],
              prompt: list[int] | None = None) -> torch.Tensor:
    """Logits after the bias, vLLM's repetition penalty (over the prompt and the tokens generated so far: a positive
    logit divided by it, a negative one multiplied, as vLLM and transformers apply it) and OpenAI's penalties:
    ``- frequency * count - presence * (count > 0)`` over the tokens generated so far."""
    if params.logit_bias:
        ids, bias = zip(*params.logit_bias)
        logits = logits.index_add(0, torch.tensor(ids, device=logits.device),
                                  torch.tensor(bias, device=logits.device, dtype=logits.dtype))
    if params.repetition_penalty != 1.0 and (seen := (prompt or []) + out):  # after the bias, as vLLM's sampler
        index = torch.tensor(sorted(set(seen)), device=logits.device)
        picked = logits.index_select(0, index)
        penalty = params.repetition_penalty
        logits = logits.index_copy(0, index, torch.where(picked > 0, picked / penalty, picked * penalty))
    if out and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(out, device=logits.device), minlength=logits.numel()).to(logits.dtype)
        logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _logprob(logits: torch.Tensor, token: int, k: int) -> Logprob:
    scores = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(scores, k) if k else None
    pairs = tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ()
    return Logprob(token, float(scores[token]), pairs)


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None
