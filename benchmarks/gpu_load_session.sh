#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): issue 43's H200 figures and the rest of issue
# 42's rerun, in the order of what each needs, every step's output in $OUT as it lands:
#  1. ten 8B demo models of different answers in 53 GB of disk (m0 whole, m1-m9 link its first three shards and
#     draw their last: `demo-model --link-shards-from`);
#  2. `hotweights switch` over m0-m2 with vLLM from an empty keeper (benchmarks/switch_drills.py): start-up, the
#     A-B-A-C mix, a parked and the awake engine killed -9, the trace of switch_trace.py (60 s, parked on the GPU,
#     fair), SIGTERM leaving no process, no port and no GPU process but the keeper (the check the 2026-12-03 run
#     lost to its trace's SSE reader);
#  3. on that keeper, the same trace through stop-and-start and static partitioning (issue 43's ratios), then the
#     fifo schedule and mixed tiers while time is left (BUDGET_S, from the script's start);
#  4. ten 8B models behind one front with the embedded engine, five parked on the GPU and five in host memory
#     (switch_trace.py --models 10 --modes mixed --gpu-tier 5), every one answering, memory per tier read.
#   OUT=DIR bash benchmarks/gpu_load_session.sh
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
BEGAN=$(date +%s)
BUDGET_S=${BUDGET_S:-1400}
ARGS="--max-model-len 4096 --gpu-memory-utilization 0.25"
SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
left() { echo $(( BUDGET_S - ($(date +%s) - BEGAN) )); }
trace() {  # trace NAME ARGS...: one switch_trace.py run, its JSON and its fronts' logs in $OUT
  local name=$1; shift
  step "trace $name"
  python3 switch_trace.py --size 8b --models-dir "$W" --out "$W/trace-$name" --json \
    --partial-json "$OUT/trace_8b_$name.partial.json" "$@" > "$OUT/trace_8b_$name.json" 2> "$OUT/trace_8b_$name.err"
  echo "trace rc=$?" >> "$OUT/trace_8b_$name.err"
  cp "$W/trace-$name"/trace-front-*.log "$OUT/" 2>/dev/null
}
cd benchmarks
step models
python3 -c "import sys; from pathlib import Path; from switch_mix import write_models
write_models(Path(sys.argv[1]), ['8b'] * 10, 'cuda', link_shards=True)" "$W" > "$OUT/models.err" 2>&1
df -h /tmp > "$OUT/disk.txt"; du -sh --count-links "$W" >> "$OUT/disk.txt"; du -sh "$W" >> "$OUT/disk.txt"
switch_drills_8b "$SOCK" "$ARGS"
for mode in restart static park_fifo mixed; do
  [ "$(left)" -gt 560 ] || break  # the ten-model step needs about 360 s
  trace "$mode" --models 3 --engine vllm --engine-args "$ARGS" --rate 1 --duration-s 60 --modes "$mode" \
    --socket-dir "$SOCK"
done
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before_ten.txt" 2>&1
SOCK10=$(mktemp -d /tmp/hw-keep10-XXXX)
trace ten_embedded --models 10 --engine hotweights --engine-args "--device cuda --max-model-len 4096" --modes mixed \
  --gpu-tier 5 --rate 0.5 --max-tokens 16,32 --duration-s 60 --socket-dir "$SOCK10"
python3 -m hotweights stop --socket-dir "$SOCK10" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
