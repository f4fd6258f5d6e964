"""The vLLM plugin's vLLM-free options: extra config, layouts, the sleep-mode rule.

Run: pytest tests/test_vllm_options.py
"""

from __future__ import annotations

import pytest

from hotweights.config import AttachConfig
from hotweights.engines.vllm.options import LAYOUTS, sleep_mode_refusal, split_extra_config


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


def test_sleep_mode_refused_only_for_zero_copy_engine_layout():
    message = sleep_mode_refusal(True, "zero_copy", "auto")
    assert message and "--enable-sleep-mode" in message and '"mode": "copy"' in message
    assert sleep_mode_refusal(True, "zero_copy", "engine")
    assert sleep_mode_refusal(True, "copy", "auto") is None
    assert sleep_mode_refusal(True, "zero_copy", "checkpoint") is None
    assert sleep_mode_refusal(False, "zero_copy", "auto") is None
