#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): the vLLM paths that only a GPU worker
# runs, after a change to them: the suite's cuda tests (the plugin's strict budget check, the CUDA pools),
# then benchmarks/vllm_standby.py on the 0.6B demo model, eager (stock from disk, the cache alone, the
# launcher with the standby), whose JSON says per start: ready, answer, weights, KV cache, mapped, standby.
#   OUT=DIR bash benchmarks/gpu_tidy_session.sh     (writes DIR/tests.txt, DIR/standby_06b.json, DIR/done)
set -uo pipefail
source /tmp/gpu-vllm/env.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/hw-tidy-XXXX)
# pytest, if the image lacks it: wheels carried in .gpu-vllm/extra (pip download pytest pytest-timeout ...)
python3 -c "import pytest, pytest_timeout" 2>/dev/null || \
  python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-vllm/site .gpu-vllm/extra/*.whl
python3 -m pytest -q -p no:cacheprovider tests/test_vllm_gpu.py tests/test_pools_cuda.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$?" >> "$OUT/tests.txt"
python3 -m hotweights demo-model "$W/m06" --size 0.6b --gen-device cuda > /dev/null
python3 benchmarks/vllm_standby.py --model "$W/m06" --repeat 2 --modes stock,cache,launcher --eager \
  --gpu-memory-utilization 0.5 --out "$OUT/logs" --json > "$OUT/standby_06b.json" 2> "$OUT/standby_06b.err"
echo "standby rc=$?" >> "$OUT/standby_06b.err"
tar -czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$OUT/logs"
touch "$OUT/done"
