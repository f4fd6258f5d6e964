#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): a parked vLLM engine takes over the restart
# of the same start (hotweights vllm serve --park-on-exit), 0.6B demo model, eager.   OUT=DIR bash benchmarks/gpu_takeover_session.sh
set -uo pipefail
source /tmp/gpu-vllm/env.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/hw-to-XXXX)
python3 -m hotweights demo-model "$W/m06" --size 0.6b --gen-device cuda > /dev/null
python3 benchmarks/vllm_takeover.py --model "$W/m06" --repeat 3 --eager --out "$OUT/logs" --json \
  > "$OUT/takeover_06b_eager.json" 2> "$OUT/takeover_06b_eager.err"
echo "takeover rc=$?" >> "$OUT/takeover_06b_eager.err"
touch "$OUT/done"
