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


SERVE_HASH = """
import json, sys
from hotweights.engines.vllm import register
register()
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
hashes = []
for argv in json.loads(sys.argv[1]):
    args, _ = parser.parse_known_args(["--model", argv[0], *argv[1:]])  # the server's own flags change no graph
    hashes.append(EngineArgs.from_cli_args(args).create_engine_config().compute_hash())
print(json.dumps(hashes))
"""


@pytest.mark.parametrize("which", ["current", "0.26"])
def test_the_switchs_compile_ahead_fills_the_compile_cache_key_its_start_reads(three, which, monkeypatch):
    """The compile ahead of a start (``switch/kinds.py``: random weights, a pinned KV cache, its own memory share)
    differs from the start only where vLLM's compile-cache key does not look; a start with another graph (another
    ``--dtype``) does not share it."""
    from conftest import VLLM026_PYTHON

    from hotweights.switch import kinds
    from hotweights.switch.config import ModelConfig

    python = VLLM_PYTHON if which == "current" else VLLM026_PYTHON
    if not python:
        pytest.skip("set HOTWEIGHTS_VLLM026_PYTHON (make test does)")
    monkeypatch.setattr(kinds, "is_cpu_build", lambda: False)  # the commands a GPU build would run
    vllm = kinds.KINDS["vllm"]
    args = ("--dtype", "bfloat16", "--max-model-len", "256", "--gpu-memory-utilization", "0.3", "--max-num-seqs", "8")
    model = ModelConfig("a", three[0], "vllm", args)

    def served(cmd: list[str]) -> list[str]:
        return cmd[cmd.index("serve") + 1:]

    ahead, _ = vllm.compile_ahead_command(model, 8000, False, 143_771)
    start, _ = vllm.command(model, 8000, False)
    other, _ = vllm.command(ModelConfig("a", three[0], "vllm", ("--dtype", "float16", *args[2:])), 8000, False)
    assert "dummy" in ahead and "hotweights" in start
    r = subprocess.run([python, "-c", SERVE_HASH, json.dumps([served(ahead), served(start), served(other)])],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ahead_hash, start_hash, other_hash = json.loads(r.stdout.strip().splitlines()[-1])
    assert ahead_hash == start_hash != other_hash
