"""The native decoder computes what transformers computes, for every architecture it claims."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hotweights.engines.native import reason_unsupported
from hotweights.engines.transformers import load_model
from hotweights.serve.generate import Generator, SamplingParams, step_of
from hotweights.serve.tokenizer import Tokenizer


def both(model_dir):
    hf, hf_report = load_model(model_dir, load_format="auto", impl="transformers")
    native, report = load_model(model_dir, load_format="auto", impl="native")
    assert (hf_report.engine, report.engine) == ("transformers", "native")
    return hf, native


def compare_steps(hf, native, atol: float) -> None:
    ids = torch.tensor([[5, 17, 200, 3, 99, 42, 7, 250]])
    with torch.inference_mode():
        a, past_a = step_of(hf)(ids, None)
        b, past_b = step_of(native)(ids, None)
        torch.testing.assert_close(b.float(), a.float(), atol=atol, rtol=0)
        nxt = torch.tensor([[int(a.argmax())]])
        a2, _ = step_of(hf)(nxt, past_a)
        b2, _ = step_of(native)(nxt, past_b)
        torch.testing.assert_close(b2.float(), a2.float(), atol=atol, rtol=0)


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_demo_models_give_transformers_logits_and_greedy_answers(models, size):
    hf, native = both(models[size])
    compare_steps(hf, native, atol=1e-4 if size == "tiny" else 0.0)  # bf16: bitwise, measured
    tok = Tokenizer(models[size])
    answers = []
    for model in (hf, native):
        g = Generator(model, tok, max_model_len=256, eos_ids={258},
                      vocab_size=json.loads((models[size] / "config.json").read_text())["vocab_size"])
        chunks = list(g.stream(tok.encode("The weight cache"), SamplingParams(max_tokens=20, temperature=0)))
        answers.append(("".join(c.text for c in chunks), chunks[-1].num_tokens))
    assert answers[0] == answers[1] and answers[0][1] > 0


def _save(config, path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_other_architectures_match_transformers(tmp_path, arch):
    import transformers

    common = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    config = {"llama": lambda: transformers.LlamaConfig(**common, attention_bias=True, mlp_bias=True),
              "qwen2": lambda: transformers.Qwen2Config(**common),
              "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None)}[arch]()
    path = _save(config, tmp_path / arch)
    assert reason_unsupported(json.loads((path / "config.json").read_text())) is None
    hf, native = both(path)
    names = {n for n, _ in native.named_parameters()}
    assert names == {n for n, _ in hf.named_parameters()}  # biases included (llama: both, qwen2: q/k/v)
    compare_steps(hf, native, atol=1e-4)


@pytest.mark.parametrize("change, reason", [
    ({"model_type": "gemma"}, "model_type 'gemma'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope scaling 'llama3'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope scaling 'yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantized"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "other than full attention"),
])
def test_what_the_native_decoder_leaves_to_transformers(models, change, reason):
    config = {**json.loads((models["small"] / "config.json").read_text()), **change}
    assert reason in reason_unsupported(config)


def test_native_refuses_what_it_does_not_cover_and_auto_uses_transformers(models, tmp_path):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(models["tiny"], d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    with pytest.raises(ValueError, match="native decoder does not cover this model .*rope scaling 'linear'"):
        load_model(d, load_format="auto", impl="native")
    _, report = load_model(d, load_format="auto", impl="auto")
    assert report.engine == "transformers"


def test_serving_imports_nothing_of_transformers_or_the_compiler(models):
    code = ("import sys, torch; from hotweights.engines.transformers import load_model; "
            f"m, r = load_model({str(models['small'])!r}, load_format='auto', impl='auto'); m.warm_up(); "
            "print(r.engine, sorted({k.split('.')[0] for k in sys.modules} & {'transformers', 'sympy'}), "
            "'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["native", "[]", "False"], out
