#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): what issue 32 still lacks there after
# gpu_switch/switch_mix_8b_park.json (the park mode, measured; every mode ran in gpu_switch/switch_mix_8b.json): `hotweights switch` with three 8B demo models
# of different bytes (seeds 0-2), vLLM engines, an A-B-A-C mix, all modes side by side in one run: stopped
# and started (--no-parking, llama-swap's way; 3 switches: each is a whole start; first, as it pays the three
# preloads), parked with the weights on the GPU again (20 switches), vLLM's own sleep level 1 (weights from
# disk, 20 switches), parked with the weights in host memory (--parked-weights host, 20 switches; last: it
# leaves the entries there). Its results are written after each mode, so a cut run keeps them. The restart
# mode's start-up preloads the three models, each followed at once by its first `hotweights vllm serve`: the
# front's `ready in` lines time the preload and that start apart, and engine_starts says whether the start
# waited for the preload's standby (issue 31: it should not any more). Then verify --engine vllm through
# the launcher with its park drill (its memory now counts the server a standby forks). The cache files
# written during the switch step (caches_written.txt, with their times beside the front's lines) say what the
# first start after each preload compiles again in the 16 s after its graph capture, which later starts skip.
#   OUT=DIR bash benchmarks/gpu_switch_session.sh
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"  # the pools did not change since they last ran
step switch
touch "$OUT/mark_before_switch"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/gpu_before_switch.txt" 2>&1
ps -eo pid,ppid,rss,args --sort=-rss | head -20 >> "$OUT/gpu_before_switch.txt"  # what held 4 GiB last time
python3 benchmarks/switch_mix.py --models 3 --size 8b --gen-device cuda --engine vllm --switches 20 \
  --restart-switches 3 --modes restart,park,vllm_sleep,park_host --out "$W/switch" \
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
