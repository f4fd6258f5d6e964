"""What the installed vLLM offers, and what a vLLM without it is told (``capabilities.py``), without vLLM.
Detection against the real vLLM is in test_vllm.py.

Run: pytest tests/test_vllm_capabilities.py
"""

from __future__ import annotations


def test_what_a_vllm_without_the_capabilities_is_told():
    from hotweights.engines.vllm.capabilities import Capabilities, engine_layout_refusal, missing_line

    old = Capabilities("0.26.0", None, False)
    assert old.missing == ("weights_already_processed", "get_external_weight_memory")
    assert missing_line(old).startswith("vLLM 0.26.0 lacks weights_already_processed (engine-layout entries of "
                                        "quantized models are not attached; use layout checkpoint")
    assert engine_layout_refusal(old, None) is None  # unquantized: replayed post-processing transforms nothing
    assert "fp8 engine-layout entry would be post-processed twice" in engine_layout_refusal(old, "fp8")
    new = Capabilities("0.32.0", object(), True)
    assert missing_line(new) is None and engine_layout_refusal(new, "fp8") is None
