#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): what the last run
# (gpu_switch/switch_mix_8b.json, every mode side by side) found and what was fixed after it, on the CPU only:
# a parking front's start-up from an empty keeper, three 8B demo models of different bytes (seeds 0-2). Each
# model is preloaded with --enable-sleep-mode now (it is in vLLM's compile-cache key: the parking engines'
# first starts compiled again, 23-31 s), its first start takes the standby the preload left although it runs
# with VLLM_SERVER_DEV_MODE=1 (which pinned it: a plain start, 86 s), and a start right after a ready one waits
# for the standby that start prepared (it found none: 80.9 s). engine_starts and the front's `ready in` lines
# say whether every start came from a standby without compiling; then 20 switches parked on the GPU and 20
# from host memory again, and verify --engine vllm through the launcher with its park drill (its memory counts
# the server a standby forks; its park start should now be a standby start).
#   OUT=DIR bash benchmarks/gpu_switch_session.sh
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"  # the pools did not change since they last ran
step switch
touch "$OUT/mark_before_switch"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before_switch.txt" 2>&1
# (the 4.1 GiB in use before the last run's front was its own CUDA context: models are written apart now)
python3 benchmarks/switch_mix.py --models 3 --size 8b --gen-device cuda --engine vllm --switches 20 \
  --modes park,park_host --out "$W/switch" \
  --engine-args "--max-model-len 512 --gpu-memory-utilization 0.25" --partial-json "$OUT/switch_partial.json" \
  --json > "$OUT/switch_mix_8b.json" 2> "$OUT/switch_mix_8b.err"
echo "switch rc=$?" >> "$OUT/switch_mix_8b.err"
cp "$W"/switch/front-*.log "$OUT/" 2>/dev/null
cp -r "$W"/switch/logs-* "$OUT/" 2>/dev/null  # the engines' own logs (vLLM's phases per start)
find ~/.triton ~/.cache/vllm ~/.cache/flashinfer ~/.cache/torch -type f -newer "$OUT/mark_before_switch" \
  -printf '%TT %s %p\n' 2>/dev/null | sort > "$OUT/caches_written.txt"
step verify
verify_vllm_06b
step done
touch "$OUT/done"
