#!/usr/bin/env bash
# One runner for GPU sessions (one H100 or H200, two for `tp2`; vLLM 0.26 staged per ../shared/gpu-vllm/README.md):
# RUNS names the runs to make; they go in the order listed below, each writing its JSON in $OUT as it lands, and a
# timestamped line in $OUT/progress.txt as it begins (what the polling calls read). Where device time is short, a
# run that needs more than what BUDGET_S has left is skipped and says so.
#   first call:  bash benchmarks/gpu_models_bg.sh /tmp/hw-models N 8b   (runs over the 8B models m0..m(N-1): N as
#                the largest run needs, written while the next calls stage vLLM)
#   then:        W=/tmp/hw-models OUT=DIR BUDGET_S=1400 RUNS="cuda fill3 fill10" bash benchmarks/gpu_run.sh
#   polls:       bash benchmarks/gpu_poll.sh DIR 540 /tmp/hw-models
# Run it detached where a device call's time limit could cut it (setsid nohup bash benchmarks/gpu_run.sh > /dev/null
# 2>&1 &), and poll. Helpers: `step NAME`, `models_written N` (waits for gpu_models_bg.sh), `trace NAME ARGS...` (one
# switch_trace.py run, its fronts' and engines' logs beside), `switch_drills_8b SOCK ARGS`, `verify_vllm_06b`,
# `left` (seconds of BUDGET_S left), `cold` (an empty keeper and compile caches), `bench NAME SCRIPT ARGS...`.
#
# The runs (the session scripts each replaces are in git history: `git show 8066cd0:benchmarks/gpu_NAME_session.sh`):
#   cuda        the suite's GPU tests of what the runs use: test_publish, test_pools_cuda, test_vllm_gpu (tidy,
#               park, fill; CUDA_TESTS=0 skipped it there)
#   standby06   vllm_standby.py on the 0.6B demo, eager: stock from disk, the cache alone, the launcher (tidy)
#   headline    vllm_standby.py on the 8B demo, graphs, util 0.85, 3 rounds of STANDBY_MODES (default stock,
#               standby_disk, cache, launcher) (headline; standby: STANDBY_MODES=stock,launcher)
#   upload      host_upload.py, 16 GiB: the wake's preadv into pinned stages against the mapping (headline, park_wake)
#   park        vllm_sleep.py on the 8B demo, graphs, beside stock vLLM's own sleep (park, headline, park_wake)
#   sleep06     vllm_sleep.py on the 0.6B demo, eager and graphs (sleep)
#   takeover    vllm_takeover.py on the 8B demo, graphs, with its drills (park_wake); takeover06: 0.6B, eager (takeover)
#   verify06    verify --engine vllm through the launcher on the 0.6B demo, its park drill included (headline,
#               switch, faults, park_wake)
#   mix         switch_mix.py over three 8B (util 0.25), 20 switches parked on the GPU and from host memory (switch)
#   drills      switch_drills.py over m0-m2 from an empty keeper (start-up, the A-B-A-C mix, engines killed -9,
#               the trace, SIGTERM), then on its keeper the trace's other modes in DRILL_MODES (default static
#               restart park_fifo mixed vllm_sleep) while time is left (faults, load)
#   sweep       issue 52's load sweep over three 8B: the front's defaults against static partitioning at 2, 6 and
#               16 req/s, REPEATS runs a rate; then the A-B-A-C mix; then the policy of .before/src (policy)
#   ten_vllm    ten 8B (util 0.17), six on the GPU tier, the trace at 1 req/s (ten)
#   ten_policy  ten 8B, KV caches pinned to 2 GiB, per-model Poisson 0.1 and 0.5 req/s (ten_policy)
#   ten_embedded  ten 8B with the embedded engine, six on the GPU tier (load)
#   kvswitch    issue 69: tests/test_switch_vllm_gpu.py (a vLLM stream held across its engine's park, its KV kept)
#   fill10kv    issue 69: ten 8B as fill10, FILL10KV_MODES (default mixed_preempt_deadline_awake2,
#               mixed_preempt_deadline, mixed_preempt_nokv: two engines at a time, memory alone, today's preempt)
#               at FILL10_RATES (0.1,0.5), FILL10KV_S (120,60: the issue's) s a rate, FILL10_REPEATS (1) runs
#               each, one front a mode;
#               on an H100: FILL_MODELS=5 FILL_TIER=3 FILL_ARGS="$TEN" with --gpu-memory-utilization 0.3
#   sweep69     issue 69: models per GPU, SWEEP69 (6 8 10 12) models at 0.1 req/s each for 120 s, FILL_TIER (6) of
#               them on the GPU tier, SWEEP69_MODES (mixed_preempt_deadline_awake2); a front and a keeper each
#   hostwake, one3, fill10, fill3off, fill3ahead, fill3, fill3kept, seven, eight: issue 55's fill and issue 52's
#               many-model traces, each from an empty keeper and empty compile caches (fill; see `fill_runs` below)
#   tp2         two GPUs: a 32B at TP=2 parked and woken, taken over, a standby start, the switch (tp2)
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
RUNS=" ${RUNS:?name the runs: RUNS=\"cuda fill3\"} "
runs() { [[ $RUNS == *" $1 "* ]]; }
TRACE=(--engine vllm --link-shards --gen-device cuda --burst-size 0 --max-tokens 32,512)
TEN="--max-model-len 4096 --gpu-memory-utilization 0.17 --kv-cache-memory-bytes 2G --max-num-seqs 32 --max-num-batched-tokens 2048"
THREE="--max-model-len 4096 --gpu-memory-utilization 0.25"
cold() {  # an empty keeper (a fresh socket directory) and no compile cache; COLD_DISK=1: no page cache either;
  # `cold kept`: the compile caches kept (a reboot, where ~/.cache/vllm and the Triton cache survive)
  python3 -m hotweights stop --socket-dir "${SOCK:-/nonexistent}" > /dev/null 2>&1
  python3 -m hotweights standby --stop --socket-dir "${SOCK:-/nonexistent}" > /dev/null 2>&1  # the last preload's
  [ "${1:-}" = kept ] || rm -rf ~/.cache/vllm/torch_compile_cache /tmp/torchinductor_"$(id -un)" ~/.triton/cache
  if [ "${COLD_DISK:-0}" = 1 ]; then  # the models' pages evicted, as after a reboot
    python3 -c 'import sys; from hotweights.verify.memory import evict_page_cache as e; [e(d) for d in sys.argv[1:]]' \
      "$W"/m*
  fi
  SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
}
enough() {  # enough SECONDS NAME: whether BUDGET_S has SECONDS left for run NAME (else it says it is skipped)
  [ "$(left)" -gt "$1" ] && return 0
  step "skipped $2 ($(left) s left)"
  return 1
}
demo() {  # demo SIZE: the demo model of SIZE in $W, written once
  [ -f "$W/demo-$1/config.json" ] || python3 -m hotweights demo-model "$W/demo-$1" --size "$1" --gen-device cuda \
    > /dev/null
  echo "$W/demo-$1"
}
bench() {  # bench NAME SCRIPT ARGS...: one benchmark script's JSON in $OUT/NAME.json, its stderr and rc beside
  local name=$1; shift
  step "$name"
  python3 "$BENCH/$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$?" >> "$OUT/$name.err"
}
need=0
for run in fill10 fill10kv ten_vllm ten_policy ten_embedded; do runs $run && need=${FILL_MODELS:-10}; done
if runs sweep69; then for n in ${SWEEP69:-6 8 10 12}; do [ "$n" -gt $need ] && need=$n; done; fi
[ $need = 0 ] && runs eight && need=8
[ $need = 0 ] && runs seven && need=7
for run in one3 fill3 fill3off fill3ahead fill3kept sweep drills mix; do [ $need = 0 ] && runs $run && need=3; done

if runs cuda && [ "${CUDA_TESTS:-1}" = 1 ]; then
  step "cuda tests"  # a pass here before minutes of runs
  python3 -c "import pytest, pytest_timeout" 2>/dev/null || \
    python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-vllm/site .gpu-vllm/extra/*.whl
  python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_publish.py tests/test_pools_cuda.py tests/test_vllm_gpu.py \
    > "$OUT/tests_cuda.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/tests_cuda.txt"
fi
if [ $need -gt 0 ]; then
  step models
  models_written $need || { step "models failed"; cp "$W/models.log" "$OUT/" 2>/dev/null; }
fi
if runs kvswitch; then
  step "kvswitch test"
  python3 -c "import pytest, pytest_timeout" 2>/dev/null || \
    python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-vllm/site .gpu-vllm/extra/*.whl
  python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_switch_vllm_gpu.py -o log_cli=false \
    --basetemp /tmp/hw-kvswitch > "$OUT/tests_kvswitch.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/tests_kvswitch.txt"
  cp /tmp/hw-kvswitch/*/front-*.log "$OUT/" 2>/dev/null
  tar czf "$OUT/kvswitch_logs.tgz" --exclude="*.safetensors" -C /tmp/hw-kvswitch . 2>/dev/null
fi
runs standby06 && bench standby_06b vllm_standby.py --model "$(demo 0.6b)" --repeat 2 --modes stock,cache,launcher \
  --eager --gpu-memory-utilization 0.5 --out "$OUT/logs_standby06"
runs headline && bench headline_8b vllm_standby.py --model "$(demo 8b)" --repeat "${STANDBY_REPEAT:-3}" \
  --modes "${STANDBY_MODES:-stock,standby_disk,cache,launcher}" --gpu-memory-utilization 0.85 --out "$OUT/logs_headline"
runs upload && bench host_upload_16g host_upload.py --gib 16 --repeat 5 --threads 16 --pread-threads 8,16 --with-unmap
runs park && bench park_8b_graphs vllm_sleep.py --model "$(demo 8b)" --repeat 5 --stock --out "$OUT/logs_park"
if runs sleep06; then
  bench sleep_06b_eager vllm_sleep.py --model "$(demo 0.6b)" --repeat 5 --eager
  bench sleep_06b_graphs vllm_sleep.py --model "$(demo 0.6b)" --repeat 5
fi
runs takeover && bench takeover_8b_graphs vllm_takeover.py --model "$(demo 8b)" --repeat 5 --drills \
  --out "$OUT/logs_takeover"
runs takeover06 && bench takeover_06b_eager vllm_takeover.py --model "$(demo 0.6b)" --repeat 3 --eager \
  --out "$OUT/logs_takeover06"
if runs verify06; then
  step verify06
  verify_vllm_06b
fi
cd "$BENCH"
if runs mix; then
  cold
  bench switch_mix_8b switch_mix.py --models 3 --size 8b --gen-device cuda --engine vllm --switches 20 \
    --modes park,park_host --out "$W" --engine-args "--max-model-len 512 --gpu-memory-utilization 0.25" \
    --socket-dir "$SOCK" --partial-json "$OUT/switch_partial.json"
  cp "$W"/front-*.log "$OUT/" 2>/dev/null
fi
if runs drills; then
  cold
  switch_drills_8b "$SOCK" "$THREE"
  for mode in ${DRILL_MODES:-static restart park_fifo mixed vllm_sleep}; do
    enough 260 "$mode" || break
    trace "$mode" --models 3 --engine vllm --engine-args "$THREE" --rate 1 --duration-s 60 --modes "$mode" \
      --socket-dir "$SOCK"
  done
fi
if runs sweep; then
  cold
  SWEEP=(--models 3 --engine vllm --engine-args "$THREE" --rates 2,6,16 --duration-s 30 --max-tokens 32,512)
  trace sweep "${SWEEP[@]}" --modes park,static --repeats "${REPEATS:-2}" --socket-dir "$SOCK"
  enough 200 mix && bench mix_8b switch_mix.py --models 3 --size 8b --out "$W" --engine vllm \
    --engine-args "$THREE" --switches 12 --modes park --socket-dir "$SOCK"
  [ -d "$BENCH/../.before/src" ] && enough 330 before && trace before "${SWEEP[@]}" --modes before \
    --before-src "$(cd "$BENCH/.." && pwd)/.before/src" --socket-dir "$SOCK"
fi
if runs ten_vllm; then
  cold
  trace ten_vllm --models 10 --engine vllm --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.17" \
    --modes mixed --gpu-tier 6 --rate 1 --duration-s 60 --socket-dir "$SOCK"
fi
if runs ten_policy; then
  cold
  trace ten_policy --models 10 --engine vllm --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.17 \
--kv-cache-memory-bytes 2G" --modes mixed --gpu-tier 6 --per-model-rate 0.1,0.5 --link-shards --gen-device cuda \
    --burst-size 0 --duration-s 60 --max-tokens 32,512 --socket-dir "$SOCK"
fi
if runs ten_embedded && enough 150 ten_embedded; then
  cold
  trace ten_embedded --models 10 --engine hotweights --engine-args "--device cuda --max-model-len 4096" \
    --modes mixed --gpu-tier 6 --rate 0.5 --max-tokens 16,32 --duration-s 60 --socket-dir "$SOCK"
fi
fill_runs() {  # issue 55's fill and issue 52's many-model traces, in this order (every engine --max-num-seqs 32)
  if runs hostwake; then  # a wake from the host copy by part: queued DMAs (pinned), one wait each, stages
    python3 host_wake_profile.py "$W/m0" --rounds 9 --json-out "$OUT/host_wake_queued.json" \
      > "$OUT/host_wake_queued.txt" 2>&1
    echo "rc=$?" >> "$OUT/host_wake_queued.txt"
  fi
  if runs one3; then  # issue 52's preempt on the GPU: three 8B, one awake at a time, without and with preempt
    cold
    export HOTWEIGHTS_PROFILE_WAKE=1
    trace one3 --models 3 "${TRACE[@]}" --engine-args "$TEN" --modes one,one_preempt --rates 1,2 --duration-s 30 \
      --socket-dir "$SOCK"
    unset HOTWEIGHTS_PROFILE_WAKE
  fi
  if runs fill10; then  # ten 8B, six on the GPU tier, four in host memory; then the same front again with preempt
    cold
    export HOTWEIGHTS_PROFILE_WAKE=1  # vLLM's own wake_up profiled into the engines' logs (its slow mode)
    export HOTWEIGHTS_PROFILE_START=1  # vLLM's warm-up sampled: what the 15-21 s after graph capture are
    trace fill10 --models 10 "${TRACE[@]}" --engine-args "$TEN" --modes mixed,mixed_preempt --gpu-tier 6 \
      --per-model-rate "${FILL10_RATES:-0.1,0.5}" --duration-s "${FILL10_S:-60}" --socket-dir "$SOCK"
    unset HOTWEIGHTS_PROFILE_WAKE HOTWEIGHTS_PROFILE_START
  fi
  if runs fill10kv; then  # issue 69: today's preempt (continued from tokens) against streams held with their KV
    cold
    trace fill10kv --models "${FILL_MODELS:-10}" "${TRACE[@]}" --engine-args "${FILL_ARGS:-$TEN}" \
      --gpu-tier "${FILL_TIER:-6}" \
      --modes "${FILL10KV_MODES:-mixed_preempt_deadline_awake2,mixed_preempt_deadline,mixed_preempt_nokv}" \
      --repeats "${FILL10_REPEATS:-1}" \
      --per-model-rate "${FILL10_RATES:-0.1,0.5}" --duration-s "${FILL10KV_S:-120,60}" --socket-dir "$SOCK"
  fi
  if runs sweep69; then  # issue 69: models per GPU at 0.1 req/s each, Aegaeon's SLO >= 90% (an H200: 6 8 10 12)
    local n first=1
    for n in ${SWEEP69:-6 8 10 12}; do
      enough 420 "sweep69 $n" || break
      if [ $first = 1 ]; then cold; first=0; else cold kept; fi  # one compile, then from its cache
      trace sweep69_$n --models "$n" "${TRACE[@]}" --engine-args "${FILL_ARGS:-$TEN}" \
        --gpu-tier $(( n < ${FILL_TIER:-6} ? n : ${FILL_TIER:-6} )) \
        --modes "${SWEEP69_MODES:-mixed_preempt_deadline_awake2}" \
        --per-model-rate 0.1 --duration-s 120 --socket-dir "$SOCK"
    done
  fi
  local run flag
  for run in fill3off fill3ahead fill3 fill3kept; do  # three 8B, the front's defaults: start-up, then 30 s at 2 req/s
    runs $run || continue
    case $run in fill3off) flag=--no-read-ahead ;; fill3ahead) flag=--compile-ahead ;; *) flag= ;; esac
    if [ $run = fill3kept ]; then cold kept; else cold; fi
    trace $run --models 3 "${TRACE[@]}" --engine-args "$THREE" --modes park --rates 2 --duration-s 30 \
      --socket-dir "$SOCK" $flag
  done
  if runs seven && enough 420 seven; then  # seven 8B all on the GPU tier, 0.1 req/s each
    cold
    trace seven --models 7 "${TRACE[@]}" --engine-args "$TEN" --modes park,preempt --per-model-rate 0.1 \
      --duration-s 60 --socket-dir "$SOCK"
  fi
  if runs eight && enough 420 eight; then  # seven on the GPU tier, one in host memory
    cold
    trace eight --models 8 "${TRACE[@]}" --engine-args "$TEN" --modes mixed,mixed_preempt --gpu-tier 7 \
      --per-model-rate 0.1 --duration-s 60 --socket-dir "$SOCK"
  fi
}
fill_runs
if runs tp2; then  # two GPUs: the 32B written once, then each step's JSON as it lands (a cut run keeps the rest)
  m32=$(demo 32b)
  nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$OUT/gpus.txt" 2>&1
  bench sleep_32b_tp2 vllm_sleep.py --model "$m32" --tensor-parallel-size 2 --repeat 3 --stock --stock-repeat 2 \
    --gpu-memory-utilization 0.75 --out "$W/sleep"
  bench takeover_32b_tp2 vllm_takeover.py --model "$m32" --tensor-parallel-size 2 --repeat 3 --out "$W/takeover"
  bench standby_32b_tp2 vllm_standby.py --model "$m32" --repeat 1 --modes launcher --tensor-parallel-size 2 \
    --gpu-memory-utilization 0.75 --out "$W/standby"
  mkdir -p "$W/switch2" && ln -sfn "$m32" "$W/switch2/m2"
  bench switch_tp2 switch_mix.py --models 3 --sizes 8b,8b,32b --gpus "0;1;0,1" --gen-device cuda --engine vllm \
    --switches 20 --modes park,park_host --out "$W/switch2" \
    --engine-args "--max-model-len 512 --gpu-memory-utilization 0.3" --partial-json "$OUT/switch_tp2_partial.json"
  cp "$W"/switch2/front-*.log "$OUT/" 2>/dev/null
fi
python3 -m hotweights stop --socket-dir "${SOCK:-/nonexistent}" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
