#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): vLLM's own sleep with zero-copy weights,
# on the 0.6B demo model, eager and with CUDA graphs.  OUT=DIR bash benchmarks/gpu_sleep_session.sh
set -uo pipefail
source /tmp/gpu-vllm/env.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/hw-sleep-XXXX)
python3 -m hotweights demo-model "$W/m06" --size 0.6b --gen-device cuda > /dev/null
python3 benchmarks/vllm_sleep.py --model "$W/m06" --repeat 5 --eager --json > "$OUT/sleep_06b_eager.json" 2> "$OUT/sleep_06b_eager.err"
echo "eager rc=$?" >> "$OUT/sleep_06b_eager.err"
python3 benchmarks/vllm_sleep.py --model "$W/m06" --repeat 5 --json > "$OUT/sleep_06b_graphs.json" 2> "$OUT/sleep_06b_graphs.err"
echo "graphs rc=$?" >> "$OUT/sleep_06b_graphs.err"
touch "$OUT/done"
