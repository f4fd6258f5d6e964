# Sourced by the GPU session scripts (benchmarks/gpu_*_session.sh): vLLM's staged environment, $OUT, a work
# directory $W (a new one unless given), `step NAME` (a timestamped line in $OUT/progress.txt, what the polling calls read) and
# `verify_vllm_06b` (verify --engine vllm through the launcher on a 0.6B demo, its park drill included),
# `switch_drills_8b SOCK ARGS` (benchmarks/switch_drills.py over three 8B with vLLM), `models_written N` (waits for
# gpu_models_bg.sh), `trace NAME ARGS...` (one switch_trace.py run) and `left` (seconds of BUDGET_S left); then,
# unless NO_POOLS_MODEL=1, the CUDA pool tests (their output in $OUT/pools_cuda.txt) and the 8B demo in $W/m8b.
set -uo pipefail
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # benchmarks/, wherever the session script changes to
source /tmp/gpu-vllm/env.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=${W:-$(mktemp -d /tmp/hw-gpu-XXXX)}  # a W given: where an earlier call wrote the models
mkdir -p "$W"
step() { echo "$(date +%T) $*" >> "$OUT/progress.txt"; }
verify_vllm_06b() {
  python3 -m hotweights demo-model "$W/m06" --size 0.6b --gen-device cuda > /dev/null
  python3 -m hotweights verify --engine vllm --device cuda --model "$W/m06" --dtype bfloat16 --port 8123 \
    --no-cold-start --out "$OUT/verify_vllm" > "$OUT/verify.txt" 2>&1
  echo "verify rc=$?" >> "$OUT/verify.txt"
}
models_written() {  # models_written N: until m0..m(N-1) under $W are whole and gpu_models_bg.sh's writer has ended
  while pgrep -f write_models > /dev/null; do sleep 2; done
  sync  # their dirty pages written back now, not during the first run (on an H100 its preloads took 68 s, not 30)
  [ -f "$W/m$(( $1 - 1 ))/tokenizer_config.json" ]
}
BEGAN=$(date +%s)
left() { echo $(( ${BUDGET_S:-1500} - ($(date +%s) - BEGAN) )); }  # seconds left of BUDGET_S, from the start
trace() {  # trace NAME ARGS...: one switch_trace.py run over 8B models in $W, its JSON, fronts' and engines' logs in $OUT
  local name=$1; shift
  step "trace $name"
  python3 "$BENCH/switch_trace.py" --size 8b --models-dir "$W" --out "$W/trace-$name" --json \
    --partial-json "$OUT/trace_8b_$name.partial.json" "$@" > "$OUT/trace_8b_$name.json" 2> "$OUT/trace_8b_$name.err"
  echo "trace rc=$?" >> "$OUT/trace_8b_$name.err"
  for f in "$W/trace-$name"/trace-front-*.log; do cp "$f" "$OUT/${name}_$(basename "$f")" 2>/dev/null; done
  tar czf "$OUT/logs_$name.tgz" --exclude='*.json' -C "$W/trace-$name" . 2>/dev/null  # preloads', engines' logs
}
switch_drills_8b() {  # switch_drills_8b SOCK ARGS: `hotweights switch` over $W/m0-m2 (vLLM) from the empty keeper SOCK
  step switch
  (cd "$BENCH" && python3 switch_drills.py --models 3 --size 8b --models-dir "$W" \
    --engine vllm --engine-args "$2" --switches 12 --trace-s 60 --socket-dir "$1" --out "$W/drills" --json \
    > "$OUT/switch_drills_8b.json" 2> "$OUT/switch_drills_8b.err")
  echo "drills rc=$?" >> "$OUT/switch_drills_8b.err"
  cp "$W/drills/front.log" "$OUT/drills_front.log" 2>/dev/null
  cp "$W/drills/drills.partial.json" "$OUT/switch_drills_8b.partial.json" 2>/dev/null
  tar czf "$OUT/drills_logs.tgz" -C "$W/drills" logs 2>/dev/null
}
if [ "${NO_POOLS_MODEL:-0}" != 1 ]; then
  step pools
  python3 -m pytest -q -p no:cacheprovider tests/test_pools_cuda.py > "$OUT/pools_cuda.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/pools_cuda.txt"
  step models
  python3 -m hotweights demo-model "$W/m8b" --size 8b --gen-device cuda > /dev/null
fi
