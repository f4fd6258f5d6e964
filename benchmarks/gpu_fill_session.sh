#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): issue 55's fill targets with the preload that
# runs vLLM's loader without a vLLM start (engines/vllm/publish.py) and the compile cache keyed by the models'
# config files (engines/vllm/compile_key.py); then issue 52's "most 8B models at 0.1 req/s each". Each run starts
# from an empty keeper and an empty compile cache (vLLM's and inductor's removed: the cold box, the worst case).
#   1. three 8B (the front's defaults, --gpu-memory-utilization 0.25): start-up until every model serves (target
#      60 s), then 30 s at 2 req/s; fill3off and fill3ahead (not by default): the same with read_ahead false,
#      and with compile_ahead true, before fill3; COLD_DISK=1: each run with the models' pages evicted too (a reboot);
#   2. ten 8B, six on the GPU tier and four in host memory, KV caches pinned to 2 GiB: start-up (target 180 s;
#      1,014.6 s with the whole-start preloads, 581.6 s with the loader-alone ones, 2026-12-04; 297.5 s, then
#      209.4 s on 2026-12-05), then per-model 0.1 and 0.5 req/s for 60 s each; then the same with preempt = true,
#      its front started on the keeper the first one left (its start-up: issue 55's restart with every model cached); its
#      engines' wakes profiled (HOTWEIGHTS_PROFILE_WAKE) and their warm-ups sampled (HOTWEIGHTS_PROFILE_START);
#   one3 (not by default): three 8B on the GPU tier, one engine awake at a time (max_awake 1), at 1 and 2 req/s,
#      without and with preempt (issue 52: a busy engine's requests paused and continued, measured on the GPU);
#   3. while time is left, seven 8B all on the GPU tier at 0.1 req/s each, without and with preempt (does the box
#      serve seven at >= 90%? it did on 2026-12-05: 100%);
#   fill3kept (not by default; after fill3): fill3 again from an empty keeper with the compile caches kept (a reboot);
#   hostwake (not by default; first): benchmarks/host_wake_profile.py on m0, the pinned wake with its DMAs queued
#      against each waited for, and the stages (resident.QUEUED_COPIES), interleaved;
#   eight (not by default): eight 8B, seven on the GPU tier and one in host memory, 0.1 req/s each, without and
#      with preempt (the next step of "the most 8B models at >= 90%").
#   Every engine runs with --max-num-seqs 32 (since 2026-12-05; fill10 before that had vLLM's default): vLLM then
#   captures CUDA graphs for batches of up to 64 (11 sizes, not 51), and a parked engine keeps 976 MiB on the GPU,
#   not 1,902 (read there), so two host-tier models fit awake beside the rest, not one; at 0.1-0.5 req/s a model
#   has a few requests at once at most.
#   The runs go in this order: hostwake, one3, fill10, fill3off, fill3ahead, fill3, fill3kept, seven, eight.
#   first call:  bash benchmarks/gpu_models_bg.sh /tmp/hw-models 10 8b     (while the next calls stage vLLM)
#   then:        W=/tmp/hw-models OUT=DIR BUDGET_S=1400 [RUNS="fill3 fill10 seven"] bash benchmarks/gpu_fill_session.sh
#                (RUNS: the runs to make, in the order above; RUNS=fill3 needs only three models written;
#                FILL10_RATES=0.5: fill10's trace at one per-model rate, not two, where device time is short;
#                FILL10_S=40: its seconds per cell, 60 by default)
#   polls:       bash benchmarks/gpu_poll.sh DIR 540 /tmp/hw-models
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
TRACE=(--engine vllm --link-shards --gen-device cuda --burst-size 0 --max-tokens 32,512)
TEN="--max-model-len 4096 --gpu-memory-utilization 0.17 --kv-cache-memory-bytes 2G --max-num-seqs 32"
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
RUNS=" ${RUNS:-fill3 fill10 seven} "
runs() { [[ $RUNS == *" $1 "* ]]; }
if [ "${CUDA_TESTS:-1}" = 1 ]; then  # CUDA_TESTS=0: not again where device time is short and they passed on its code
  step "cuda tests"  # the GPU-marked tests of what this script's runs use (a pass here before minutes of runs)
  python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_publish.py tests/test_pools_cuda.py \
    > "$OUT/tests_cuda.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/tests_cuda.txt"
fi
cd benchmarks
step models
need=3; runs seven && need=7; runs eight && need=8; runs fill10 && need=10
models_written $need || { step "models failed"; cp "$W/models.log" "$OUT/" 2>/dev/null; }
if runs hostwake; then  # a wake from the host copy by part: queued DMAs (pinned), one wait each (pinned_each), stages
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
if runs fill10; then
  cold
  export HOTWEIGHTS_PROFILE_WAKE=1  # vLLM's own wake_up profiled into the engines' logs (its slow mode)
  export HOTWEIGHTS_PROFILE_START=1  # vLLM's warm-up sampled: what the 15-21 s after graph capture are
  trace fill10 --models 10 "${TRACE[@]}" --engine-args "$TEN" --modes mixed,mixed_preempt --gpu-tier 6 \
    --per-model-rate "${FILL10_RATES:-0.1,0.5}" --duration-s "${FILL10_S:-60}" --socket-dir "$SOCK"
  unset HOTWEIGHTS_PROFILE_WAKE HOTWEIGHTS_PROFILE_START
fi
if runs fill3off; then  # without the read-ahead: before and after, one session
  cold
  trace fill3off --models 3 "${TRACE[@]}" --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.25" \
    --modes park --rates 2 --duration-s 30 --socket-dir "$SOCK" --no-read-ahead
fi
if runs fill3ahead; then  # with the compile ahead (off by default since fill3_h100_2026-12-05c.json)
  cold
  trace fill3ahead --models 3 "${TRACE[@]}" --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.25" \
    --modes park --rates 2 --duration-s 30 --socket-dir "$SOCK" --compile-ahead
fi
if runs fill3; then
  cold
  trace fill3 --models 3 "${TRACE[@]}" --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.25" \
    --modes park --rates 2 --duration-s 30 --socket-dir "$SOCK"
fi
if runs fill3kept; then  # fill3's start again from an empty keeper, the compile caches the run before left kept
  cold kept
  trace fill3kept --models 3 "${TRACE[@]}" --engine-args "--max-model-len 4096 --gpu-memory-utilization 0.25" \
    --modes park --rates 2 --duration-s 30 --socket-dir "$SOCK"
fi
if runs seven && [ "$(left)" -gt 420 ]; then
  cold
  trace seven --models 7 "${TRACE[@]}" --engine-args "$TEN" --modes park,preempt --per-model-rate 0.1 \
    --duration-s 60 --socket-dir "$SOCK"
fi
if runs eight && [ "$(left)" -gt 420 ]; then  # one more than seven: seven on the GPU tier, one in host memory
  cold
  trace eight --models 8 "${TRACE[@]}" --engine-args "$TEN" --modes mixed,mixed_preempt --gpu-tier 7 \
    --per-model-rate 0.1 --duration-s 60 --socket-dir "$SOCK"
fi
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
