#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md), a session of its own: issue 43's ten 8B vLLM
# models behind one front, six parked on the GPU and four in host memory, under the trace (switch_trace.py --modes
# mixed --gpu-tier 6: 60 s, 1 req/s, then every model asked once), memory per tier read; then, on the same keeper
# (m3-m9's entries released), the three-model modes the 2026-12-03 run had no time for, while BUDGET_S lasts.
#
# Each engine gets `--gpu-memory-utilization 0.17`: vLLM asks for that share of the GPU free at its start, less
# the weights it maps from the keeper (engines/vllm/budget.py), so 0.17 x 139.8 GiB - 15.26 GiB = 8.5 GiB for its
# KV cache (7.5 GiB read on 2026-12-03), graphs (1.0) and activations. At 0.25 (the three-model runs) the last
# GPU-tier starts would find less free than the 19.7 GiB each needs (the front's fit line: 145.7 of 140.4 GiB).
# Start-up takes the host tier right after the default (switch/schedule.py startup_order), so that their weights
# leave the GPU before the GPU tier's fill it. The first attempt (2026-12-03, commit d5a79c9) stopped at the
# GPU-tier starts: the vLLM budget counted other models' parked engines in each start's share (fixed since;
# git show 34b815a^:benchmarks/results/gpu_load/ten_vllm_2026-12-03_failed.json). The second (commit 5146117) ran it all: start-up 963 s, the
# trace's p99 2.12 s, then park_host (results/gpu_load/ten_vllm_2026-12-03.json).
#   first call:  bash benchmarks/gpu_models_bg.sh /tmp/hw-models 10 8b     (while the next calls stage vLLM)
#   then:        W=/tmp/hw-models OUT=DIR BUDGET_S=1500 bash benchmarks/gpu_ten_session.sh
#   polls:       bash benchmarks/gpu_poll.sh DIR 540 /tmp/hw-models
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
BUDGET_S=${BUDGET_S:-1500}
TEN_ARGS="--max-model-len 4096 --gpu-memory-utilization 0.17"
THREE_ARGS="--max-model-len 4096 --gpu-memory-utilization 0.25"  # as the three-model modes of 2026-12-03
SOCK=$(mktemp -d /tmp/hw-keep-XXXX)
cd benchmarks
step models
models_written 10 || { step "models failed"; cp "$W/models.log" "$OUT/" 2>/dev/null; }
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before.txt" 2>&1
trace ten_vllm --models 10 --engine vllm --engine-args "$TEN_ARGS" --modes mixed --gpu-tier 6 --rate 1 \
  --duration-s 60 --socket-dir "$SOCK"
step release
python3 - "$SOCK" > "$OUT/released.txt" 2>&1 <<'EOF'
import sys
from hotweights.client import connect
from hotweights.paths import daemon_paths
with connect(daemon_paths(sys.argv[1])) as client:
    for row in client.status().rows():
        if row.model not in ("m0", "m1", "m2"):
            client.release(row.key)
            print("released", row.model, row.key)
EOF
for mode in park_host park_fifo vllm_sleep; do
  need=$([ "$mode" = vllm_sleep ] && echo 560 || echo 260)  # three standby starts and the trace; sleep: disk starts
  [ "$(left)" -gt "$need" ] || { step "skipped $mode ($(left) s left)"; continue; }
  trace "$mode" --models 3 --engine vllm --engine-args "$THREE_ARGS" --rate 1 --duration-s 60 --modes "$mode" \
    --socket-dir "$SOCK"
done
python3 -m hotweights stop --socket-dir "$SOCK" > /dev/null 2>&1
step done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"  # one file: a call returns only a few
touch "$OUT/done"
