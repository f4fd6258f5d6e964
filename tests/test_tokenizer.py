"""The server's tokenizer agrees with transformers' fast tokenizer on what serving uses."""

from __future__ import annotations

import json
import shutil

import pytest

from hotweights.serve.tokenizer import Tokenizer, clean_up_spaces

TEXTS = ["hello world", "héllo wörld ☃ and <|im_end|> inside", "  spaces\n\tand tabs ", ""]
MESSAGES = [[{"role": "user", "content": "hi"}],
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]]


def test_encode_decode_and_chat_template_match_transformers(models):
    from transformers import AutoTokenizer

    ours, theirs = Tokenizer(models["small"]), AutoTokenizer.from_pretrained(models["small"])
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False).input_ids
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    for messages in MESSAGES:
        assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)
    assert ours.eos_token_id == theirs.eos_token_id == 258


def test_templates_get_transformers_helpers_and_special_tokens(models, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(models["tiny"], d)
    template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
                "{% if loop.index > 2 %}{% break %}{% endif %}{{ m['content'] | tojson }}{{ eos_token }}{% endfor %}")
    (d / "chat_template.jinja").write_text(template)  # the file wins over tokenizer_config.json's
    tok = Tokenizer(d)
    msgs = [{"role": "user", "content": "é"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]
    assert tok.apply_chat_template(msgs) == '"é"<|im_end|>"b"<|im_end|>'
    with pytest.raises(Exception, match="no tools"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_space_clean_up_follows_the_tokenizer_config(models, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(models["tiny"], d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    tok = Tokenizer(d)
    assert tok.decode(tok.encode("a , b .")) == "a, b." == clean_up_spaces("a , b .")
    assert Tokenizer(models["tiny"]).decode(Tokenizer(models["tiny"]).encode("a , b .")) == "a , b ."
