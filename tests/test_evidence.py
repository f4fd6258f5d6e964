"""Evidence lines: exact shapes, and the patterns that recognise them (the only parsers).

Run: pytest tests/test_evidence.py
"""

from __future__ import annotations

from hotweights import evidence


def test_evidence_shapes_are_exact():
    assert evidence.mapped(47, 3 << 29, "/run/hw/daemon.sock", "zero_copy", 3.25) == (
        "Mapped 47 tensors (1.50 GiB) from weight cache daemon /run/hw/daemon.sock (mode=zero_copy) in 3.2 ms")
    assert evidence.published(399, 16 << 30, "Qwen3-8B", "abcdef012345", "cuda:GPU-1", 4.567) == (
        "Published 399 tensors (16.00 GiB) to weight cache: Qwen3-8B [abcdef012345] on cuda:GPU-1 in 4.57 s")
    assert evidence.falling_back("daemon unavailable: x") == (
        "Weight cache unusable (daemon unavailable: x); falling back to disk loading")
    assert evidence.strict_failure("miss").startswith("Weight cache unusable (miss) and fallback is disabled")
    assert evidence.daemon_ready("/s", 12) == "Weight cache daemon READY: socket=/s pid=12"


def test_patterns_recognise_the_lines_they_are_built_from():
    mapped = evidence.mapped(47, 3 << 29, "/run/hw/daemon.sock", "stream", 3.25)
    m = evidence.MAPPED_RE.search("INFO 11-29 12:40:16 [hotweights] " + mapped)
    assert m and m.groups() == ("47", "1.50", "/run/hw/daemon.sock", "stream", "3.2")
    published = evidence.published(399, 16 << 30, "Qwen3-8B", "abcdef012345", "cuda:GPU-1", 4.567)
    assert evidence.PUBLISHED_RE.search(published).groups() == ("399", "16.00", "Qwen3-8B", "abcdef012345",
                                                                  "cuda:GPU-1")
    assert evidence.FALLBACK_MARK in evidence.falling_back("x")
    assert evidence.STRICT_MARK in evidence.strict_failure("x")
    assert evidence.daemon_ready("/s", 1).startswith(evidence.READY_MARK)


def test_a_wake_line_says_where_the_weights_came_from_and_how_fast_a_host_copy_came():
    assert evidence.woke("m", 0.25, None) == "Woke m in 0.250 s (weights kept mapped)"
    assert evidence.woke("m", 0.25, "gpu") == "Woke m in 0.250 s (weights from gpu)"
    host = evidence.woke("m", 0.412, "host", "16.40 GB at 47.1 GB/s")
    assert host == "Woke m in 0.412 s (weights from host, 16.40 GB at 47.1 GB/s)"
    assert evidence.WOKE_RE.search(host).groups() == ("m", "0.412", "from host", "16.40 GB at 47.1 GB/s")
    assert evidence.woke_source("x\n" + host) == "host" and evidence.woke_source(evidence.woke("m", 1, None)) is None
    assert evidence.woke_source(evidence.woke("m", 1.0, "gpu+host", "1.00 GB at 40.0 GB/s")) == "gpu+host"


def test_the_strict_message_ends_with_what_to_do():
    assert evidence.strict_failure("x").endswith("start the daemon and preload the model (hotweights preload "
                                                 "--model DIR), or set fallback to true")


def test_a_line_is_evidence_when_the_documented_grep_would_find_it():
    assert evidence.is_evidence(evidence.mapped(1, 1, "/s", "zero_copy", 1.0))
    assert evidence.is_evidence(evidence.falling_back("x"))
    assert evidence.is_evidence(evidence.daemon_ready("/s", 1))
    assert not evidence.is_evidence("INFO Uvicorn running on http://127.0.0.1:8000")


def test_the_startup_line_round_trips_through_its_parser():
    phases = {"imports": 2.5, "cuda_context": 0.31, "tokenizer": 0.01, "model_build": 0.02, "weights": 0.0123,
              "warmup": 0.05, "listening": 0.2}
    line = evidence.startup(phases, engine="native", source="cache", ready_s=3.1)
    assert line.startswith("startup: imports=2.50s tokenizer=0.01s cuda_context=0.31s model_build=0.02s "
                           "(engine=native) weights=0.012s (source=cache) warmup=0.05s listening=0.20s ready=3.10s")
    parsed = evidence.parse_startup(f"noise\nINFO {line}\nmore")
    assert parsed == {"phases": {**phases, "weights": 0.012}, "engine": "native", "source": "cache", "ready_s": 3.1}
    assert evidence.parse_startup("no such line") is None


def test_a_wake_refusal_is_read_once_for_the_switch_and_for_parked_engines():
    """One reader of an engine's ``hotweights: cannot wake ...`` line (the switch's wake and ``hotweights parked
    --wake`` read it apart before): its reason, and whether it was for memory (another engine may park for it)."""
    from hotweights.evidence import wake_refusal

    log = ("INFO vLLM: sleeping\n"
           "ERROR hotweights: cannot wake m: its weights are not in the keeper any more\n"
           "INFO something else\n")
    refusal = wake_refusal(log)
    assert refusal is not None and not refusal.for_memory
    assert refusal.reason == "cannot wake m: its weights are not in the keeper any more"
    log += "ERROR x hotweights: cannot wake m: it needs 15.30 GiB back on its GPU but 3.10 GiB is free\n"
    assert wake_refusal(log).for_memory  # the last one counts
    assert wake_refusal("INFO vLLM: woke\n") is None
