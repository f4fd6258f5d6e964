"""compile_key.config_digest: a model's compile-cache factor from its config files (vLLM-free)."""

from __future__ import annotations

import json
import shutil

from hotweights.engines.vllm.compile_key import config_digest


def _model(tmp_path, name: str, **changes) -> str:
    d = tmp_path / name
    d.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "_name_or_path": f"/train/{name}", "transformers_version": "4.57.0", **changes}
    (d / "config.json").write_text(json.dumps(config))
    (d / "tokenizer_config.json").write_text(json.dumps({"name": name}))
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.1 if name == "a" else 0.7}))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": f"{name}.safetensors"}}))
    return str(d)


def test_models_that_differ_only_in_weights_names_and_tokenizers_share_a_digest(tmp_path):
    a, b = _model(tmp_path, "a"), _model(tmp_path, "b")
    assert config_digest(a) == config_digest(b) and config_digest(a).startswith("config-sha256:")


def test_a_shape_or_a_separate_quantization_file_changes_it(tmp_path):
    a, deeper = _model(tmp_path, "a"), _model(tmp_path, "deeper", num_hidden_layers=3)
    assert config_digest(a) != config_digest(deeper)
    quant = shutil.copytree(a, tmp_path / "quant")
    (quant / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    assert config_digest(str(quant)) != config_digest(a)


def test_no_config_or_an_unreadable_one_keeps_vllms_own_factor(tmp_path):
    assert config_digest(str(tmp_path / "missing")) is None
    assert config_digest("meta-llama/Llama-3.1-8B") is None  # a hub name: the path stays the factor
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert config_digest(str(broken)) is None
