"""transformers adapter: a model attached from the cache answers exactly like a disk load.

Run: pytest tests/test_transformers_engine.py
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli

from hotweights.engines.transformers import load_model


def greedy(model, n: int = 8) -> list[int]:
    ids = torch.tensor([[72, 101, 108, 108, 111]])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=256)
    return out[0, ids.shape[1]:].tolist()


def test_tied_weights_stay_one_object_and_answers_match_disk(models, daemon):
    sock = str(daemon.paths.directory)
    disk, report = load_model(models["tiny"], dtype="float16", load_format="auto")
    assert report.source == "disk"
    warm, report = load_model(models["tiny"], dtype="float16", config={"socket_dir": sock, "publish": True})
    assert report.source == "disk+publish"
    warm2, report = load_model(models["tiny"], dtype="float16", config={"socket_dir": sock, "fallback": False})
    assert report.source == "cache"
    assert warm2.lm_head.weight is warm2.model.embed_tokens.weight
    assert all(p.device.type == "cpu" for p in warm2.parameters())
    assert greedy(disk) == greedy(warm) == greedy(warm2)


@pytest.mark.slow  # three CLI processes that each import transformers: 13 s of the fast tier
def test_generate_cli_reports_source(models, daemon):
    sock = str(daemon.paths.directory)
    preloaded = run_cli("preload", "--model", str(models["small"]), "--dtype", "float16", "--socket-dir", sock)
    assert preloaded.returncode == 0, preloaded.stderr
    warm = run_cli("generate", "--model", str(models["small"]), "--dtype", "float16", "--json",
                   "--model-loader-extra-config", json.dumps({"socket_dir": sock, "fallback": False}))
    disk = run_cli("generate", "--model", str(models["small"]), "--dtype", "float16", "--json", "--load-format", "auto")
    assert warm.returncode == 0 and disk.returncode == 0, warm.stderr + disk.stderr
    w, d = json.loads(warm.stdout), json.loads(disk.stdout)
    assert w["source"] == "cache" and d["source"] == "disk"
    assert w["token_ids"] == d["token_ids"] and len(w["token_ids"]) == 16
    assert "Mapped 47 tensors (0.01 GiB) from weight cache daemon" in warm.stderr
