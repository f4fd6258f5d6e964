#!/usr/bin/env bash
# Two H200s (`nvidia-h200-x2`; vLLM 0.26 staged per ../shared/gpu-vllm/README.md): issue 33, parked engines and
# the switch with tensor parallelism. Not run yet: written while that kind was not lent, from the one-GPU
# benchmarks that ran (each step's script is the one of its one-GPU figure, given --tensor-parallel-size 2).
# Steps in order of what the issue needs most; each writes its JSON when done, so a cut run keeps the rest:
# 1. a 32B demo with TP=2 parked and woken, weights kept on the GPUs, unmapped, and from host memory (each
#    rank's entry demoted), its residue per GPU, the same greedy answer; beside it stock vLLM from disk with
#    its own sleep level 1 (sleep_32b_tp2.json);
# 2. `hotweights vllm serve` of a parked start to /health, TP=2 (takeover_32b_tp2.json);
# 3. a fresh standby start (last measured 23.9 s, stock 81.6 s: gpu_standby/standby_32b_tp2.json);
# 4. `hotweights switch` with an 8B on each GPU and the 32B on both, A-B-A-C: an 8B wakes beside the other,
#    the 32B parks both (switch_tp2.json). Budget: the 32B's preload compiles (minutes); watch progress.txt.
#   OUT=DIR bash benchmarks/gpu_tp2_session.sh
NO_POOLS_MODEL=1 source "$(dirname "$0")/gpu_session_start.sh"
step models
python3 -m hotweights demo-model "$W/m32" --size 32b --gen-device cuda > /dev/null
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$OUT/gpus.txt" 2>&1
step sleep
python3 benchmarks/vllm_sleep.py --model "$W/m32" --tensor-parallel-size 2 --repeat 3 --stock --stock-repeat 2 \
  --gpu-memory-utilization 0.75 --out "$W/sleep" --json > "$OUT/sleep_32b_tp2.json" 2> "$OUT/sleep.err"
step takeover
python3 benchmarks/vllm_takeover.py --model "$W/m32" --tensor-parallel-size 2 --repeat 3 --out "$W/takeover" \
  --json > "$OUT/takeover_32b_tp2.json" 2> "$OUT/takeover.err"
step standby
python3 benchmarks/vllm_standby.py --model "$W/m32" --repeat 1 --modes launcher --tensor-parallel-size 2 \
  --gpu-memory-utilization 0.75 --out "$W/standby" --json > "$OUT/standby_32b_tp2.json" 2> "$OUT/standby.err"
step switch
mkdir -p "$W/switch" && ln -s "$W/m32" "$W/switch/m2"  # the 32B written once (switch_mix uses a whole model dir)
python3 benchmarks/switch_mix.py --models 3 --sizes 8b,8b,32b --gpus "0;1;0,1" --gen-device cuda --engine vllm \
  --switches 20 --modes park,park_host --out "$W/switch" \
  --engine-args "--max-model-len 512 --gpu-memory-utilization 0.3" --partial-json "$OUT/switch_partial.json" \
  --json > "$OUT/switch_tp2.json" 2> "$OUT/switch.err"
cp "$W"/switch/front-*.log "$OUT/" 2>/dev/null
step done
touch "$OUT/done"
