#!/usr/bin/env bash
# Every command of the nvidia-h200-x2 session of 2026-11-30 (fourth), run on the GPU machine in order
# from the repository root: `bash benchmarks/results/gpu_x2_session2/session.sh STEP`. vLLM 0.26.0 staged
# per ../shared/gpu-vllm/README.md first. Steps: install; serve (GPU 0 alone: issue 14); vllm (both GPUs:
# issue 12); wait SECONDS NAME... (polls the detached jobs, copies what finished to $OUT); round3.
set -u
step=$1
source benchmarks/gpu_session.sh
TAR_DIRS="vr-logs0 vr-logs1"
case $step in
install)
  bash /tmp/gpu-vllm/stage.sh .gpu-vllm/project && bash /tmp/gpu-vllm/install.sh
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv; nproc; free -g | head -2
  python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count())'
  # one checkpoint per GPU, so that evicting one from the page cache (disk_cold) leaves the other's warm
  CUDA_VISIBLE_DEVICES=0 python3 -m hotweights demo-model $M/8b --size 8b --gen-device cuda &
  CUDA_VISIBLE_DEVICES=1 python3 -m hotweights demo-model $M/8b-b --size 8b --gen-device cuda &
  wait; sync; du -sh $M/*; sha256sum $M/8b/model-00001-of-*.safetensors $M/8b-b/model-00001-of-*.safetensors
  ;;
serve)  # issue 14, GPU 0, nothing else running: where the GIL goes in a start, then the restart benchmark
  bg serve "mkdir -m 700 -p /tmp/hw-sg && (python3 -m hotweights daemon --socket-dir /tmp/hw-sg &) && sleep 1 \
    && CUDA_VISIBLE_DEVICES=0 python3 -m hotweights preload --model $M/8b --device cuda --socket-dir /tmp/hw-sg \
    && CUDA_VISIBLE_DEVICES=0 python3 benchmarks/startup_gc.py --model $M/8b --socket-dir /tmp/hw-sg --device cuda \
       --repeat 3 --json > /tmp/bg/startup_gc_cuda.json; python3 -m hotweights stop --socket-dir /tmp/hw-sg; \
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/serve_restart.py --model $M/8b --size 8b --device cuda --repeat 3 \
       --json > /tmp/bg/serve_restart_8b.json"
  ;;
vllm)  # issue 12: vLLM restart rounds, CUDA graphs on, one daemon and checkpoint per GPU; GPU 1 then drills
  bg vr0 "CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vllm_restart.py --device cuda --model $M/8b --socket-dir \
    /tmp/hw-vr0 --keep-daemon --append /tmp/bg/vr0.json --logs /tmp/vr-logs0 \
    --modes disk,engine,engine_copy,stream,disk_cold --repeat 2 --json"
  bg gpu1 "bash benchmarks/results/gpu_x2_session2/session.sh gpu1"
  ;;
gpu1)  # run detached by `vllm`; its own compile cache so two first compiles never share a directory
  export CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vllm-cache-1
  python3 benchmarks/vllm_restart.py --device cuda --model $M/8b-b --socket-dir /tmp/hw-vr1 --keep-daemon \
    --append /tmp/bg/vr1.json --logs /tmp/vr-logs1 --modes disk_cold,stream,engine_copy,engine,disk --repeat 1 --json
  # the budget/strict refusal at device set-up (needs vLLM's GPU worker), then the strict drills' clocks
  PYTHONPATH=src:tests:$PYTHONPATH python3 -m pytest -q -m cuda tests/test_vllm_gpu.py tests/test_pools_cuda.py \
    tests/test_publish.py tests/test_reader.py > /tmp/bg/pytest_cuda.log 2>&1
  strict() {  # strict NAME SOCKET_DIR ARGS...: a strict vLLM start; seconds from spawn to exit
    local name=$1 sock=$2; shift 2
    local t0=$(date +%s.%N)
    timeout 300 python3 -m vllm.entrypoints.openai.api_server --model $M/8b-b --port 8411 --load-format hotweights \
      --model-loader-extra-config "{\"socket_dir\": \"$sock\", \"fallback\": false}" "$@" > /tmp/bg/$name.log 2>&1
    local rc=$? t1=$(date +%s.%N)
    echo "$name: exit $rc after $(python3 -c "print(round($t1 - $t0, 1))") s" >> /tmp/bg/drills.txt
    grep -E "Weight cache unusable|Free memory on device|Model loading took" /tmp/bg/$name.log | cut -c1-700 >> /tmp/bg/drills.txt
  }
  strict strict_dtype /tmp/hw-vr1 --dtype float16
  mkdir -m 700 -p /tmp/hw-none
  strict strict_no_daemon /tmp/hw-none --dtype bfloat16
  for i in 1 2; do  # what every vLLM start pays before any plugin can run
    python3 -c "import time; t = time.time(); import vllm.entrypoints.openai.api_server; \
print('import vllm.entrypoints.openai.api_server', round(time.time() - t, 1), 's')" 2>/dev/null >> /tmp/bg/drills.txt
  done
  ;;
round3)  # after both finished, with the budget left: one more round on GPU 0, the other GPU idle
  TAR_DIRS="vr-logs0"
  bg vr0b "CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vllm_restart.py --device cuda --model $M/8b --socket-dir \
    /tmp/hw-vr0 --keep-daemon --append /tmp/bg/vr0.json --logs /tmp/vr-logs0 \
    --modes engine,disk,stream,engine_copy,disk_cold --repeat 1 --json"
  wait_for 345 vr0b
  ;;
wait)
  wait_for "$2" "${@:3}"
  ;;
esac
