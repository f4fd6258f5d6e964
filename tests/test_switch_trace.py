"""``benchmarks/switch_trace.py`` on the CPU (three tiny demo models, the embedded engine): a seeded trace of
bursty, skewed, streamed requests with long prompts, run through the default front, static partitioning and the
policy before issue 52. No request may be answered by another model's engine, every request of the default front is
answered, and it serves about as many requests within the TTFT target as static partitioning (bounds loose for a
shared 2-core box).

Run: pytest tests/test_switch_trace.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "34b815a"  # the last commit of the policy before issue 52
RATE = "4.0"  # requests/s in all: the policy before gave 0.25 of static's goodput here (results/switch/)


def before_src(tmp_path: Path) -> Path | None:
    """The source tree of the policy before issue 52 (34b815a), from this clone's history; None without it."""
    dest = tmp_path / "before"
    dest.mkdir()
    archive = subprocess.run(["git", "archive", BEFORE, "src"], cwd=ROOT, capture_output=True)
    if archive.returncode:
        return None
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "src"


@pytest.mark.slow
@pytest.mark.alone  # it saturates both cores and compares two modes under that: a neighbour's load would tilt one
@pytest.mark.timeout(900)
def test_under_load_the_default_front_serves_as_static_partitioning_does_and_never_crosses_models(tmp_path):
    """Issue 52 on the CPU (three tiny models, the embedded engine, outputs up to 512 tokens): at a rate where the
    policy before gave less than half of static partitioning's goodput (benchmarks/results/switch/), the default
    front gives about as much (at least 0.9 of it in the benchmark's medians), and no request is answered by another
    model's engine. The policy before runs beside where this clone has its commit (a loaded 2-core box: only that it
    does worse is asserted)."""
    before = before_src(tmp_path)
    modes = "park,static" + (",before" if before else "")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "switch_trace.py"), "--modes", modes,
                           "--duration-s", "20", "--rates", RATE, "--max-tokens", "32,512", "--out", str(tmp_path),
                           "--json", *(["--before-src", str(before)] if before else [])],
                          capture_output=True, text=True, timeout=840, cwd=ROOT / "benchmarks")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    park, static = result["park"]["rates"][RATE]["runs"][0], result["static"]["rates"][RATE]["runs"][0]
    assert result["crossed"] == 0 and park["probe_tells_models_apart"], park["probe_answers"]
    assert park["outcomes"] == {"ok": park["requests"]} and park["requests"] > 10
    # the benchmark's medians: 1.26 of static (a saturated 2-core box, both noisy): one run here, a looser bound
    assert park["goodput_rps"] >= 0.8 * static["goodput_rps"], (park["goodput_rps"], static["goodput_rps"])
    assert result["park"]["roll_call"]["answered"] == 3  # every model, once more after it
    timeline = result["park"]["startup_timeline"]  # the fill, read from the front's log: one ready line per model
    assert sum(" ready in " in x for x in timeline) == 3 and all(x.startswith("+") for x in timeline), timeline
    if before:
        old = result["before"]["rates"][RATE]["runs"][0]
        assert old["goodput_rps"] < park["goodput_rps"], (old["goodput_rps"], park["goodput_rps"])


def test_the_trace_reads_events_whose_text_holds_what_splitlines_splits_at():
    """vLLM writes an event's text raw (a demo model's byte tokens: \\x1c, \\x85, \\u2028), which httpx's
    ``aiter_lines`` splits (on an H200 a split event stopped a whole trace); the trace ends lines at \\n only."""
    import asyncio

    import httpx
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from switch_trace import sse_events

    texts = ["a\x1cb", "\x85", "c\u2028d\u2029", "e\r\x0bf"]
    wire = "".join(f"data: {json.dumps({'choices': [{'text': t}]}, ensure_ascii=False)}\n\n" for t in texts)
    wire += "data: [DONE]\n\n"

    async def stream(request):
        async def chunks():
            for i in range(0, len(wire), 7):  # events split across chunks, mid-line
                yield wire[i:i + 7].encode()
        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def read() -> list[str]:
        transport = httpx.ASGITransport(app=Starlette(routes=[Route("/", stream)]))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            async with client.stream("GET", "/") as resp:
                return [e["choices"][0]["text"] async for e in sse_events(resp)]

    assert asyncio.run(read()) == texts


def test_the_probe_tells_models_apart_by_first_token_or_its_logprob_and_counts_a_crossed_answer():
    """Ten 8B demo models on an H200 began with other tokens but two of them with logprobs 0.033 apart: the probe
    compares the first token and its logprob, so those two are told apart; an answer that begins as another
    model's counts as crossed."""
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from switch_trace import summarize

    def probe(model: str, token: str, logprob: float) -> dict:
        return {"model": model, "probe": True, "outcome": "ok", "ttft_s": 0.1, "total_s": 0.2, "tokens": 4,
                "text": token + "...", "logprobs": [logprob, -1.0], "first_token": token}

    args = argparse.Namespace(slo_s=2.0, tpot_slo_s=0.1, duration_s=10.0)
    apart = summarize([probe("m0", "<110856>", -8.0911), probe("m8", "<139146>", -8.0584)], args, {})
    assert apart["probe_tells_models_apart"] and apart["crossed"] == 0, apart
    alike = summarize([probe("m0", "<7>", -8.0911), probe("m8", "<7>", -8.0584)], args, {})
    assert not alike["probe_tells_models_apart"]
    crossed = summarize([probe("m0", "<110856>", -8.0911), probe("m8", "<139146>", -8.0584),
                         probe("m0", "<139146>", -8.0584)], args, {})  # m0 asked, m8's answer
    assert crossed["crossed"] == 1 and crossed["probes_drifted"] == 0
    drifted = summarize([probe("m0", "<110856>", -8.0911), probe("m8", "<139146>", -8.0584),
                         probe("m0", "<90481>", -8.1001)], args, {})  # m0 asked, nobody's answer: batching noise
    assert drifted["crossed"] == 0 and drifted["probes_drifted"] == 1


def test_each_request_meets_aegaeons_slo_by_each_tokens_deadline_and_ours_by_ttft_and_tpot_per_tier():
    """Issue 69: Aegaeon's SLO (TTFT within 10 s, token i by the first token's time + 0.1 s x i: a pause is paid
    for by tokens that came early), its single-GPU one (TTFT within 5 s) and ours (TTFT within 2 s, TPOT within
    0.1 s), per request, in all and per tier."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from switch_trace import attainment

    def row(model: str, ttft: float, gaps: list[float], outcome: str = "ok") -> dict:
        at = [ttft]
        for gap in gaps:
            at.append(at[-1] + gap)
        tpot = (at[-1] - ttft) / (len(at) - 1) if len(at) > 1 else 0.0
        return {"model": model, "outcome": outcome, "ttft_s": ttft, "tpot_s": tpot, "token_at": at}

    steady = row("a", 1.0, [0.05] * 20)  # all three
    paused = row("a", 1.0, [0.01] * 20 + [0.25] + [0.01] * 5)  # a 0.25 s pause after 20 quick tokens: slack
    stalled = row("h", 1.0, [0.5] + [0.01] * 30)  # the second token 0.5 s late: Aegaeon's misses, TPOT 0.026 s
    late = row("h", 6.0, [0.05] * 5)  # within Aegaeon's 10 s, not its 5 s, not our 2 s
    failed = row("h", 0.1, [0.01], outcome="http_503")
    got = attainment([steady, paused, stalled, late, failed], {"h"})
    assert got["all"] == {"requests": 5, "aegaeon": 0.6, "aegaeon_5s": 0.4, "ours": 0.6}, got
    assert got["gpu_tier"] == {"requests": 2, "aegaeon": 1.0, "aegaeon_5s": 1.0, "ours": 1.0}
    assert got["host_tier"] == {"requests": 3, "aegaeon": round(1 / 3, 4), "aegaeon_5s": 0.0, "ours": round(1 / 3, 4)}
    # a row that missed a token's deadline says which token, and its pauses; one that met them all says nothing
    from switch_trace import late_tokens

    assert late_tokens(stalled) == {"aegaeon_late": {"token": 1, "at_s": 1.5, "due_s": 1.1, "pauses": [[1, 0.5]]}}
    assert late_tokens(paused) == late_tokens(late) == late_tokens(failed) == {}


def test_each_rate_of_a_sweep_runs_for_its_own_duration():
    """Issue 69's protocol: 120 s at 0.1 req/s per model, 60 s at 0.5 (``--duration-s 120,60``, the lowest rate's
    first); one value is every rate's; a count that is neither is refused before anything starts."""
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from switch_trace import at_rate, make_trace

    args = argparse.Namespace(duration_of={0.1: 120.0, 0.5: 60.0}, zipf_s=1.1, prompt_range=(32, 64),
                              max_tokens_range=(8, 16), per_model_rate="0.1,0.5", burst_size=0, burst_every_s=20.0,
                              probe_every=5, duration_s="120,60")
    slow, fast = (make_trace(["m0", "m1"], at_rate(args, rate), rate, 0) for rate in (0.1, 0.5))
    assert 60 < max(r.at_s for r in slow) < 120 and 30 < max(r.at_s for r in fast) < 60
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "switch_trace.py"), "--per-model-rate",
                              "0.1,0.5", "--duration-s", "120,60,30"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "one per rate (2)" in refused.stderr, refused.stderr
