# Sourced by the GPU session scripts (benchmarks/gpu_*_session.sh): vLLM's staged environment, $OUT, a work
# directory $W, `step NAME` (a timestamped line in $OUT/progress.txt, what the polling calls read) and
# `verify_vllm_06b` (verify --engine vllm through the launcher on a 0.6B demo, its park drill included); then,
# unless NO_POOLS_MODEL=1, the CUDA pool tests (their output in $OUT/pools_cuda.txt) and the 8B demo in $W/m8b.
set -uo pipefail
source /tmp/gpu-vllm/env.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/hw-gpu-XXXX)
step() { echo "$(date +%T) $*" >> "$OUT/progress.txt"; }
verify_vllm_06b() {
  python3 -m hotweights demo-model "$W/m06" --size 0.6b --gen-device cuda > /dev/null
  python3 -m hotweights verify --engine vllm --device cuda --model "$W/m06" --dtype bfloat16 --port 8123 \
    --no-cold-start --out "$OUT/verify_vllm" > "$OUT/verify.txt" 2>&1
  echo "verify rc=$?" >> "$OUT/verify.txt"
}
if [ "${NO_POOLS_MODEL:-0}" != 1 ]; then
  step pools
  python3 -m pytest -q -p no:cacheprovider tests/test_pools_cuda.py > "$OUT/pools_cuda.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pools_cuda.txt"
  step models
  python3 -m hotweights demo-model "$W/m8b" --size 8b --gen-device cuda > /dev/null
fi
