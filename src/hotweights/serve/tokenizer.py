"""The server's tokenizer: ``tokenizer.json`` through ``tokenizers``, the chat template through jinja2.

transformers' ``AutoTokenizer`` wraps the same Rust tokenizer but costs seconds of imports.
This does what the server needs the way transformers' fast tokenizer does it: encode
without special tokens, decode skipping them (plus transformers' space clean-up when
``tokenizer_config.json`` asks for it), and the chat template rendered in a sandboxed
jinja2 environment with transformers' settings (trim_blocks, lstrip_blocks, loop
controls, ``raise_exception``, ``strftime_now``, ``tojson``) and the special tokens as
variables. A model without ``tokenizer.json`` (a slow, sentencepiece-only tokenizer)
gets transformers' tokenizer behind the same three methods.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        d = Path(model_dir)
        self.config: dict[str, Any] = read_json(d / "tokenizer_config.json")
        self.chat_template = _chat_template(d, self.config)
        self._template = None
        if (d / "tokenizer.json").exists():
            from tokenizers import Tokenizer as Rust

            self._rust = Rust.from_file(str(d / "tokenizer.json"))
            self._hf = None
        else:
            from transformers import AutoTokenizer

            self._rust, self._hf = None, AutoTokenizer.from_pretrained(d)
        self.cleanup = bool(self.config.get("clean_up_tokenization_spaces", False))

    def token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        return self._rust.token_to_id(token) if self._rust is not None else self._hf.convert_tokens_to_ids(token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(_token_text(self.config.get("eos_token")))

    def encode(self, text: str) -> list[int]:
        if self._rust is None:
            return self._hf(text, add_special_tokens=False).input_ids
        return self._rust.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if self._rust is None:
            return self._hf.decode(ids, skip_special_tokens=True)
        text = self._rust.decode(ids, skip_special_tokens=True)
        return clean_up_spaces(text) if self.cleanup else text

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        """The prompt for ``messages`` with the generation prompt added (needs ``chat_template``)."""
        if self._template is None:
            self._template = _compile(self.chat_template)
        specials = {k: _token_text(self.config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        return self._template.render(messages=messages, add_generation_prompt=True, tools=None, documents=None,
                                     **{k: v for k, v in specials.items() if v is not None})


def clean_up_spaces(text: str) -> str:
    """transformers' ``clean_up_tokenization``."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                 (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file of a model directory; {} when it is not there."""
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _chat_template(d: Path, config: dict[str, Any]) -> str | None:
    if (d / "chat_template.jinja").exists():
        return (d / "chat_template.jinja").read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template or None


def _compile(source: str):
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
