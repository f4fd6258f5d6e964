#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md), one run for issue 30's and 31's open figures,
# the one that was cut short first: the vLLM headline (stock, the standby alone, the cache alone, both, and the
# first start right after `preload --engine vllm`, which must find the standby the preload left); the host
# upload side by side (the wake's preadv into the pinned stages vs the mapping it replaced, its munmap counted);
# the park benchmark (host wake with the preadv upload, the residue broken down, the KV cache and the answer
# beside stock vLLM's own sleep, with vLLM's memory lines and the logprobs where the answers part); verify
# --engine vllm through the launcher. The CUDA pool tests first.
#   OUT=DIR bash benchmarks/gpu_headline_session.sh
source "$(dirname "$0")/gpu_session_start.sh"
step headline
python3 benchmarks/vllm_standby.py --model "$W/m8b" --repeat 3 --modes stock,standby_disk,cache,launcher \
  --gpu-memory-utilization 0.85 --out "$OUT/logs_headline" --json > "$OUT/headline_8b.jsonl" 2> "$OUT/headline_8b.err"
echo "headline rc=$?" >> "$OUT/headline_8b.err"
step upload
python3 benchmarks/host_upload.py --gib 16 --repeat 5 --threads 16 --pread-threads 8,16 --with-unmap --json \
  > "$OUT/host_upload_16g.json" 2> "$OUT/host_upload.err"
step park
python3 benchmarks/vllm_sleep.py --model "$W/m8b" --repeat 5 --stock --out "$OUT/logs_park" --json \
  > "$OUT/park_8b_graphs.json" 2> "$OUT/park_8b_graphs.err"
echo "park rc=$?" >> "$OUT/park_8b_graphs.err"
step verify
verify_vllm_06b
step done
touch "$OUT/done"
