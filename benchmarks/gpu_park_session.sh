#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): parked zero-copy engines on the 8B-shape
# demo model with CUDA graphs (level 1, level 2 from the GPU entry, level 2 from the host copy), beside vLLM's
# own sleep with weights from disk; then the CUDA pool tests (the deep park under a CUDA graph).
#   OUT=DIR bash benchmarks/gpu_park_session.sh
set -uo pipefail
source /tmp/gpu-vllm/env.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/hw-park-XXXX)
python3 -m pytest -q -p no:cacheprovider tests/test_pools_cuda.py > "$OUT/pools_cuda.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pools_cuda.txt"
python3 -m hotweights demo-model "$W/m8b" --size 8b --gen-device cuda > /dev/null
python3 benchmarks/vllm_sleep.py --model "$W/m8b" --repeat 5 --stock --out "$OUT/logs" --json \
  > "$OUT/park_8b_graphs.json" 2> "$OUT/park_8b_graphs.err"
echo "park rc=$?" >> "$OUT/park_8b_graphs.err"
touch "$OUT/done"
