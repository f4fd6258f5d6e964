#!/usr/bin/env bash
# GPU (one H200, vLLM 0.26 staged per ../shared/gpu-vllm/README.md): what issue 31 still lacks there, then
# issue 32's H200 targets (last: the longest; it writes its results after each mode, so a cut run keeps them):
# `hotweights switch` with three 8B demo models of different bytes (seeds 0-2), vLLM engines, an A-B-A-C mix
# of 20 switches per mode: parked with the weights on the GPU, stopped and started (--no-parking, llama-swap's
# way; 5 switches: each is a whole start), vLLM's own sleep level 1 (weights from disk),
# parked with the weights in host memory (--parked-weights host, last: it leaves the entries there).
# Before it: the first `hotweights vllm serve` right after `preload --engine vllm` (the standby the preload
# leaves, spawned through PATH now), and verify --engine vllm through the launcher with its park drill.
#   OUT=DIR bash benchmarks/gpu_switch_session.sh
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"  # the pools did not change since they last ran
step first
python3 -m hotweights demo-model "$W/switch/m0" --size 8b --gen-device cuda --seed 0 > /dev/null  # the mix's m0
python3 benchmarks/vllm_standby.py --model "$W/switch/m0" --repeat 0 --modes launcher --gpu-memory-utilization 0.85 \
  --out "$OUT/logs_first" --json > "$OUT/first_after_preload.jsonl" 2> "$OUT/first_after_preload.err"
echo "first rc=$?" >> "$OUT/first_after_preload.err"
step verify
verify_vllm_06b
step switch
python3 benchmarks/switch_mix.py --models 3 --size 8b --gen-device cuda --engine vllm --switches 20 \
  --restart-switches 5 --modes park,restart,vllm_sleep,park_host --out "$W/switch" \
  --engine-args "--max-model-len 512 --gpu-memory-utilization 0.25" --partial-json "$OUT/switch_partial.json" \
  --json > "$OUT/switch_mix_8b.json" 2> "$OUT/switch_mix_8b.err"
echo "switch rc=$?" >> "$OUT/switch_mix_8b.err"
cp "$W"/switch/front-*.log "$OUT/" 2>/dev/null
step done
touch "$OUT/done"
