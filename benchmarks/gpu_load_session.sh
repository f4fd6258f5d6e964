#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): issue 43's H200 figures and the rest of issue
# 42's rerun, in the order of what each needs, every step's output in $OUT as it lands:
#  0. ten 8B demo models of different answers in 53 GB of disk (m0 whole, m1-m9 link its first three shards and
#     draw their last: `demo-model --link-shards-from`), written by gpu_models_bg.sh in the first call, while the
#     next calls stage vLLM: this waits for all of them (on 2026-12-03 it waited for m0-m2 only, and the writer's
#     memory freed beside the default's first vLLM start failed it);
#  1. `hotweights switch` over m0-m2 with vLLM from an empty keeper (benchmarks/switch_drills.py; its preloads run
#     beside each other, preload_jobs auto): start-up, the A-B-A-C mix, a parked and the awake engine killed -9,
#     the trace of switch_trace.py (60 s, parked on the GPU, fair), SIGTERM leaving no process, no port and no GPU
#     process but the keeper;
#  2. on that keeper, the same trace through static partitioning and stop-and-start (issue 43's ratios), each a
#     front of its own, while time is left (BUDGET_S, from this script's start);
#  3. ten 8B models behind one front with the embedded engine, six parked on the GPU and four in host memory
#     (switch_trace.py --models 10 --modes mixed --gpu-tier 6), every one answering, memory per tier read.
#   W=/tmp/hw-models OUT=DIR BUDGET_S=1250 bash benchmarks/gpu_load_session.sh
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
BUDGET_S=${BUDGET_S:-1250}
ARGS="--max-model-len 4096 --gpu-memory-utilization 0.25"
SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
cd benchmarks
step models
models_written 10 || { step "models failed"; cp "$W/models.log" "$OUT/" 2>/dev/null; }  # all: the writer is a CUDA
# process, whose memory freed beside a vLLM start fails vLLM's memory profile (2026-12-03: waited for three only)
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before_switch.txt" 2>&1
switch_drills_8b "$SOCK" "$ARGS"
for mode in static restart; do
  [ "$(left)" -gt 480 ] || break  # the ten-model step needs about 250 s
  trace "$mode" --models 3 --engine vllm --engine-args "$ARGS" --rate 1 --duration-s 60 --modes "$mode" \
    --socket-dir "$SOCK"
done
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
df -h /tmp > "$OUT/disk.txt"; du -sh --count-links "$W" >> "$OUT/disk.txt"; du -sh "$W" >> "$OUT/disk.txt"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before_ten.txt" 2>&1
SOCK10=$(mktemp -d /tmp/hw-keep10-XXXX)
if [ "$(left)" -gt 150 ]; then
  trace ten_embedded --models 10 --engine hotweights --engine-args "--device cuda --max-model-len 4096" \
    --modes mixed --gpu-tier 6 --rate 0.5 --max-tokens 16,32 --duration-s 60 --socket-dir "$SOCK10"
fi
python3 -m hotweights stop --socket-dir "$SOCK10" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
