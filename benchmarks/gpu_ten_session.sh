#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md), a session of its own: issue 43's ten 8B vLLM
# models behind one front, six parked on the GPU and four in host memory, under the trace (switch_trace.py --modes
# mixed --gpu-tier 6: 60 s, 1 req/s, then every model asked once), memory per tier read. Start-up is most of it: ten
# vLLM preloads (133 s for three beside each other on 2026-12-03) and ten standby starts one after another.
#   first call:  bash benchmarks/gpu_models_bg.sh /tmp/hw-models 10 8b     (while the next calls stage vLLM)
#   then:        W=/tmp/hw-models OUT=DIR BUDGET_S=1500 bash benchmarks/gpu_ten_session.sh
#   polls:       bash benchmarks/gpu_poll.sh DIR 540 /tmp/hw-models
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
ARGS="--max-model-len 4096 --gpu-memory-utilization 0.25"
SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
cd benchmarks
step models
models_written 10 || step "models failed"  # the writer ended: no CUDA process frees memory beside a vLLM start
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before.txt" 2>&1
step "trace ten_vllm"
python3 switch_trace.py --size 8b --models-dir "$W" --out "$W/trace-ten" --json --partial-json \
  "$OUT/trace_8b_ten_vllm.partial.json" --models 10 --engine vllm --engine-args "$ARGS" --modes mixed --gpu-tier 6 \
  --rate 1 --duration-s 60 --socket-dir "$SOCK" > "$OUT/trace_8b_ten_vllm.json" 2> "$OUT/trace_8b_ten_vllm.err"
echo "trace rc=$?" >> "$OUT/trace_8b_ten_vllm.err"
cp "$W/trace-ten"/trace-front-*.log "$OUT/" 2>/dev/null
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
step done
touch "$OUT/done"
