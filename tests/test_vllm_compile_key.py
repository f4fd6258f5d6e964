"""vLLM's compile-cache key with the plugin loaded: a model's config files, not its path (real vLLM, CPU build)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import VLLM_PYTHON, needs_vllm

pytestmark = needs_vllm(VLLM_PYTHON)

HASHES = """
import json, sys
from hotweights.engines.vllm import register
register()
from vllm.engine.arg_utils import EngineArgs
print(json.dumps([EngineArgs(model=m, dtype="bfloat16", max_model_len=256, enforce_eager=True)
                  .create_engine_config().compute_hash() for m in sys.argv[1:]]))
"""


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Two demo models of different weights and one config, and a third of another shape."""
    from hotweights.demo_model import write_demo_model

    root = tmp_path_factory.mktemp("compile_key")
    a = write_demo_model(root / "a", "tiny", seed=0)
    b = write_demo_model(root / "b", "tiny", seed=1)
    c = shutil.copytree(a, root / "c")
    config = json.loads((c / "config.json").read_text())
    (c / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2 * config[
        "max_position_embeddings"]}))
    return [str(a), str(b), str(c)]


def _hashes(models: list[str], **env: str) -> list[str]:
    import os

    r = subprocess.run([VLLM_PYTHON, "-c", HASHES, *models], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("keys a model's compile cache by its config files" in r.stderr) == (not env), r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_models_of_one_config_share_vllms_compile_key_and_another_config_does_not(three):
    a, b, c = _hashes(three)
    assert a == b and a != c
    a, b, c = _hashes(three, HOTWEIGHTS_VLLM_COMPILE_KEY="path")  # vLLM's own key: the path
    assert len({a, b, c}) == 3
