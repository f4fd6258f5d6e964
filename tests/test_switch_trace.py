"""``benchmarks/switch_trace.py`` on the CPU (three tiny demo models, the embedded engine): a seeded trace of
bursty, skewed, streamed requests with long prompts, run through a parking front and a stop-and-start front. No
request may be answered by another model's engine, every request of the parking front is answered, and parking
serves more requests within the TTFT target than stopping and starting (bounds loose for a shared 2-core box).

Run: pytest tests/test_switch_trace.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_trace_through_the_switch_never_crosses_models_and_parking_beats_stopping(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "switch_trace.py"), "--modes", "park,restart",
                           "--duration-s", "20", "--rate", "1", "--out", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=840, cwd=ROOT / "benchmarks")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    park, restart = result["park"], result["restart"]
    assert result["crossed"] == 0 and park["probe_tells_models_apart"], park["probe_answers"]
    assert park["outcomes"] == {"ok": park["requests"]} and park["requests"] == result["trace"]["requests"] > 10
    assert park["switches"] > 3  # the trace asks for every model, in turns
    assert park["ttft_p99_s"] is not None and park["ttft_p99_s"] < 10, park["ttft_p99_s"]
    assert park["goodput_rps"] > restart["goodput_rps"], (park["goodput_rps"], restart["goodput_rps"])
    assert park["roll_call"]["answered"] == restart["roll_call"]["answered"] == 3  # every model, once more after it


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

    args = argparse.Namespace(slo_s=2.0, duration_s=10.0)
    apart = summarize([probe("m0", "<110856>", -8.0911), probe("m8", "<139146>", -8.0584)], args, {})
    assert apart["probe_tells_models_apart"] and apart["crossed"] == 0, apart
    alike = summarize([probe("m0", "<7>", -8.0911), probe("m8", "<7>", -8.0584)], args, {})
    assert not alike["probe_tells_models_apart"]
    crossed = summarize([probe("m0", "<110856>", -8.0911), probe("m8", "<139146>", -8.0584),
                         probe("m0", "<139146>", -8.0584)], args, {})  # m0 asked, m8's answer
    assert crossed["crossed"] == 1
