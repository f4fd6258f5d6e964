"""Verify's report: each start a bar split into its phases, and one sentence of what the cache saved."""

from __future__ import annotations

import re

from hotweights.verify.memory import page_cache_resident
from hotweights.verify.report import html_report, markdown, saved_sentence

PHASES = {"disk": {"imports": 2.4, "cuda_context": 0.0, "tokenizer": 0.01, "model_build": 0.02, "weights": 1.5,
                   "warmup": 0.03, "listening": 0.5},
          "warm1": {"imports": 2.4, "cuda_context": 0.0, "tokenizer": 0.01, "model_build": 0.02, "weights": 0.01,
                    "warmup": 0.03, "listening": 0.5}}


def receipts() -> dict:
    run = {"ready": True, "answer": "x", "log_path": "l", "evidence": [], "exit_code": None}
    return {"passed": True, "checks": [], "memory": {},
            "env": {"model": "m", "device": "cpu", "floor_s": 2.3, "versions": {}},
            "runs": {"disk": {**run, "label": "disk", "elapsed_s": 4.5, "phases": PHASES["disk"], "page_cache": 1.0,
                              "weights_s": 1.5},
                     "preload": {**run, "label": "preload", "elapsed_s": 9.0, "phases": None, "page_cache": None},
                     "warm1": {**run, "label": "warm1", "elapsed_s": 3.0, "phases": PHASES["warm1"],
                               "page_cache": 1.0, "weights_s": 0.01}}}


def test_the_report_says_what_the_cache_saved_between_like_starts():
    text = saved_sentence(receipts())
    assert text.startswith("Warm start ready in 3.00 s; disk start 4.50 s with the page cache warm (100% of the "
                           "checkpoint in the page cache); the weights phase: 1.500 s from disk (page cache warm), "
                           "0.010 s from the cache; the other 2.99 s of the warm start (imports 2.40 s")
    assert "took 2.30 s" in text
    assert text in markdown(receipts())


def test_the_report_names_the_evicted_disk_start_beside_the_warm_one():
    r = receipts()
    r["runs"]["disk_cold"] = {**r["runs"]["disk"], "label": "disk_cold", "elapsed_s": 6.25, "page_cache": 0.0,
                              "weights_s": 3.2}
    text = saved_sentence(r)
    assert ("disk start 4.50 s with the page cache warm (100% of the checkpoint in the page cache) and 6.25 s with "
            "it evicted first (0% of the checkpoint in the page cache: read from the drive)") in text
    assert "1.500 s from disk (page cache warm), 3.200 s evicted, 0.010 s from the cache" in text


def test_every_start_is_a_bar_split_into_its_phases_and_preload_is_not_a_start():
    page = html_report(receipts())
    assert len(re.findall(r"<title>weights ", page)) == 2  # one weights segment per start with phases
    assert "<title>weights 1.5 s</title>" in page and "#e8590c" in page
    assert ">weights<" in page and ">cuda_context<" not in page  # the legend: phases that took time (CPU run)
    assert ">preload<" not in page.split("<h2>Memory")[0].split("<h2>Time to ready")[1]


def test_page_cache_residency_is_read_from_the_kernel(models):
    for f in models["small"].glob("*.safetensors"):
        f.read_bytes()
    assert page_cache_resident(models["small"]) > 0.9
    assert page_cache_resident(models["small"] / "missing") is None


def test_a_vllm_run_reports_vllms_own_weight_clock():
    r = receipts()
    r["env"]["engine"] = "vllm"
    for label, seconds in (("disk", 3.72), ("warm1", 0.24)):
        r["runs"][label].update(phases=None, weights_s=seconds)
    text = saved_sentence(r)
    assert "vLLM's weight phase (its \"Model loading took\"): 3.720 s from disk (page cache warm), 0.240 s" in text
    assert "the other 2.76 s of the warm start are paid by every start" in text
    assert "| warm1 | True | 3.0 | 0.24 |" in markdown(r) and "3.00 s, weights 0.240 s" in html_report(r)


def test_a_start_that_waited_for_a_standby_still_importing_is_named_with_the_wait():
    from hotweights.evidence import standby_used

    r = receipts()
    r["env"]["engine"] = "vllm"
    r["runs"]["warm2"] = {**r["runs"]["warm1"], "label": "warm2", "elapsed_s": 30.3, "evidence": [standby_used(9, 0.1)],
                          "phases": {"imports": 21.98, "weights": 0.35, "api": 3.3}}
    r["runs"]["warm1"]["evidence"] = [standby_used(8, 24.3)]  # imports 2.4 s: under the 5 s that counts as waiting
    text = saved_sentence(r)
    assert text.endswith("Waited for a warm standby still importing: warm2 22.0 s (each start prepares the next "
                         "one's standby once it is ready; a restart sooner than its imports pays the rest).")
    assert "warm1 2.4" not in text
    r["runs"]["warm2"]["evidence"] = []  # a plain start's imports are its own, not a wait
    assert "Waited for" not in saved_sentence(r)
