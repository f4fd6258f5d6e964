# Sourced by the GPU session scripts (benchmarks/gpu_*_session.sh): vLLM's staged environment, $OUT, a work
# directory $W, `step NAME` (a timestamped line in $OUT/progress.txt, what the polling calls read), and the
# CUDA pool tests first (their output in $OUT/pools_cuda.txt), then the 8B demo model in $W/m8b.
set -uo pipefail
source /tmp/gpu-vllm/env.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/hw-gpu-XXXX)
step() { echo "$(date +%T) $*" >> "$OUT/progress.txt"; }
step pools
python3 -m pytest -q -p no:cacheprovider tests/test_pools_cuda.py > "$OUT/pools_cuda.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/pools_cuda.txt"
step models
python3 -m hotweights demo-model "$W/m8b" --size 8b --gen-device cuda > /dev/null
