#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md), issue 30's open items in one run: the CUDA
# pool tests; the host-copy upload variants (16 GiB); a restart taken over by a parked 8B engine with CUDA graphs
# plus the drills beside it (a second start counting the parked engine, a wake refused, the wake after); the
# park benchmark again (host wake with the new upload) beside vLLM's own sleep; verify --engine vllm with its
# park drill (0.6B).   OUT=DIR bash benchmarks/gpu_park_wake_session.sh
source "$(dirname "$0")/gpu_session_start.sh"
python3 -m hotweights demo-model "$W/m06" --size 0.6b --gen-device cuda > /dev/null
step upload
python3 benchmarks/host_upload.py --gib 16 --repeat 5 --json > "$OUT/host_upload_16g.json" 2> "$OUT/host_upload.err"
step takeover
python3 benchmarks/vllm_takeover.py --model "$W/m8b" --repeat 5 --drills --out "$OUT/logs_takeover" --json \
  > "$OUT/takeover_8b_graphs.json" 2> "$OUT/takeover_8b_graphs.err"
echo "takeover rc=$?" >> "$OUT/takeover_8b_graphs.err"
step park
python3 benchmarks/vllm_sleep.py --model "$W/m8b" --repeat 5 --stock --out "$OUT/logs_park" --json \
  > "$OUT/park_8b_graphs.json" 2> "$OUT/park_8b_graphs.err"
echo "park rc=$?" >> "$OUT/park_8b_graphs.err"
step verify
python3 -m hotweights verify --engine vllm --device cuda --model "$W/m06" --dtype bfloat16 --port 8123 --no-cold-start \
  --out "$OUT/verify_vllm_park" > "$OUT/verify.txt" 2>&1
echo "verify rc=$?" >> "$OUT/verify.txt"
step done
touch "$OUT/done"
