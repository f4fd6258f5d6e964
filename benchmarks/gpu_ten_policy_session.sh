#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): issue 52's ten-model targets, not yet run. Ten 8B
# vLLM models behind one front, six parked on the GPU tier and four in host memory (static partitioning does not fit:
# their weights alone are 153 GiB), per-model Poisson arrivals at 0.1 and then 0.5 requests/s (Aegaeon's SOSP'25
# rates), prompts of 32-2,000 tokens, outputs of 32-512, no bursts, 60 s a rate, SLO attainment (TTFT 2 s, TPOT
# 0.1 s) per rate. Each engine's KV cache is pinned to 2 GiB (--kv-cache-memory-bytes: a 4,096-token sequence
# needs 0.5 GiB), so that the memory model (switch/memory.py) counts about 5.9 GiB per awake engine instead of its
# 0.17 share's 10.5, and more of them stay awake at once; the front's start-up line says how many fit.
# Start-up from an empty keeper took 962.6 s for ten on 2026-12-03 (issue 55): the budget holds it and two traces.
#   first call:  bash benchmarks/gpu_models_bg.sh /tmp/hw-models 10 8b     (while the next calls stage vLLM)
#   then:        W=/tmp/hw-models OUT=DIR BUDGET_S=1450 bash benchmarks/gpu_ten_policy_session.sh
#   polls:       bash benchmarks/gpu_poll.sh DIR 540 /tmp/hw-models
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
ARGS="--max-model-len 4096 --gpu-memory-utilization 0.17 --kv-cache-memory-bytes 2G"
SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
cd benchmarks
step models
models_written 10 || { step "models failed"; cp "$W/models.log" "$OUT/" 2>/dev/null; }
trace ten_policy --models 10 --engine vllm --engine-args "$ARGS" --modes mixed --gpu-tier 6 --per-model-rate 0.1,0.5 \
  --link-shards --gen-device cuda --burst-size 0 --duration-s 60 --max-tokens 32,512 --socket-dir "$SOCK"
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
