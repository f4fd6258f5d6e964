#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): issue 52's load sweep. Three 8B vLLM models
# (--max-model-len 4096 --gpu-memory-utilization 0.25: all three fit awake, 114 GiB), the front's defaults (every
# engine that fits stays awake) against static partitioning (max_awake = 3), total rates 2, 6 and 16 requests/s,
# prompts of 32-2,000 tokens, outputs of 32-512, 30 s a run, REPEATS runs a rate; then the A-B-A-C mix one request
# at a time with one engine awake (switch_mix.py: the switch itself); then, while time is left, the policy of
# 34b815a (mode before: its source tree in .before/src, carried) on the same sweep, once.
#   first call:  bash benchmarks/gpu_models_bg.sh /tmp/hw-models 3 8b     (while the next calls stage vLLM)
#   then:        W=/tmp/hw-models OUT=DIR BUDGET_S=1300 bash benchmarks/gpu_policy_session.sh
#   polls:       bash benchmarks/gpu_poll.sh DIR 540 /tmp/hw-models
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
BUDGET_S=${BUDGET_S:-1300}
ARGS="--max-model-len 4096 --gpu-memory-utilization 0.25"
SWEEP=(--models 3 --engine vllm --engine-args "$ARGS" --rates 2,6,16 --duration-s 30 --max-tokens 32,512)
BEFORE=$(cd "$BENCH/.." && pwd)/.before/src
SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
cd benchmarks
step models
models_written 3 || { step "models failed"; cp "$W/models.log" "$OUT/" 2>/dev/null; }
trace sweep "${SWEEP[@]}" --modes park,static --repeats "${REPEATS:-2}" --socket-dir "$SOCK"
if [ "$(left)" -gt 200 ]; then
  step mix
  python3 switch_mix.py --models 3 --size 8b --engine vllm --engine-args "$ARGS" --switches 12 --modes park \
    --socket-dir "$SOCK" --out "$W" --json > "$OUT/mix_8b.json" 2> "$OUT/mix_8b.err"
  cp "$W"/front-park.log "$OUT/mix_front.log" 2>/dev/null
  echo "mix rc=$?" >> "$OUT/mix_8b.err"
fi
[ "$(left)" -gt 330 ] && trace before "${SWEEP[@]}" --modes before --before-src "$BEFORE" --socket-dir "$SOCK"
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
