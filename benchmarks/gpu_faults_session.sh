#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): issue 42's rerun of everything committed after
# 6a17507 and issue 43's trace, as a user runs them:
#  0. verify --engine vllm through the launcher on the 0.6B, to its report, while the GPU is empty;
#  1. `hotweights switch` over three 8B demo models of different bytes from an empty keeper (every model preloaded by
#     the front with --enable-sleep-mode): /health, every model started, their `ready in` lines, standby starts and
#     compiles per engine log; an A-B-A-C mix; a parked engine and then the awake one killed -9 and asked for; the
#     trace of switch_trace.py against this front (the parked-on-GPU mode, fair schedule); SIGTERM leaving no engine
#     process and no port (benchmarks/switch_drills.py). The keeper is kept for the next steps.
#  2. `hotweights vllm serve ... --park-on-exit` on that keeper, taken over twice, then a start with another
#     --max-model-len, which must retire the parked engine instead (benchmarks/vllm_takeover.py).
#  3. while time is left (BUDGET_S, from the script's start): the trace's other modes against the same trace, each a
#     front of its own on the same keeper, in the order issue 43's targets need them: static partitioning, stop and
#     start, the fifo schedule, mixed tiers, vLLM's own sleep.
#   OUT=DIR bash benchmarks/gpu_faults_session.sh
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
BEGAN=$(date +%s)
BUDGET_S=${BUDGET_S:-1300}
ARGS="--max-model-len 4096 --gpu-memory-utilization 0.25"
SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
step verify  # first, on an empty GPU: run after the drills, their keeper's 45.8 GiB left its preload no room
verify_vllm_06b
cd benchmarks
step models
for i in 0 1 2; do
  python3 -m hotweights demo-model "$W/m$i" --size 8b --gen-device cuda --seed "$i" > /dev/null
done
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before_switch.txt" 2>&1
switch_drills_8b "$SOCK" "$ARGS"
step takeover
python3 vllm_takeover.py --model "$W/m0" --repeat 2 --socket-dir "$SOCK" --base "$ARGS" \
  --changed "--max-model-len 2048" --out "$W/takeover" --json > "$OUT/takeover_8b.json" 2> "$OUT/takeover_8b.err"
echo "takeover rc=$?" >> "$OUT/takeover_8b.err"
for mode in static restart park_fifo mixed vllm_sleep; do
  [ $(( $(date +%s) - BEGAN )) -lt $(( BUDGET_S - 200 )) ] || break
  step "trace $mode"
  python3 switch_trace.py --models 3 --size 8b --models-dir "$W" --engine vllm --engine-args "$ARGS" --rate 1 \
    --duration-s 60 --modes "$mode" --socket-dir "$SOCK" --out "$W/trace" --json \
    --partial-json "$OUT/trace_8b_$mode.partial.json" > "$OUT/trace_8b_$mode.json" 2> "$OUT/trace_8b_$mode.err"
  echo "trace rc=$?" >> "$OUT/trace_8b_$mode.err"
  cp "$W/trace/trace-front-$mode.log" "$OUT/" 2>/dev/null
done
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
