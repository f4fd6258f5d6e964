"""The vLLM plugin's vLLM-free options: extra config, layouts.

Run: pytest tests/test_vllm_options.py
"""

from __future__ import annotations

import pytest

from hotweights.config import AttachConfig
from hotweights.engines.vllm.options import LAYOUTS, split_extra_config


def test_vllm_extra_config_layout_and_unknown_keys():
    assert split_extra_config(None) == ("auto", AttachConfig())
    layout, config = split_extra_config({"layout": "engine", "publish": True, "mode": "copy"})
    assert layout == "engine" and config.publish and config.mode == "copy"
    with pytest.raises(ValueError, match="layout must be one of"):
        split_extra_config({"layout": "fused"})
    with pytest.raises(ValueError, match=r"unknown weight-cache config keys \['fallbak'\].*'layout'"):
        split_extra_config({"fallbak": False})
    with pytest.raises(ValueError, match="must be a JSON object"):
        split_extra_config("fallback=false")
    assert set(LAYOUTS) == {"auto", "engine", "checkpoint"}
