#!/usr/bin/env bash
# Every command of the nvidia-h200-x2 session of 2026-11-30 (third), run on the GPU machine in order
# from the repository root: `bash benchmarks/results/gpu_x2_session/session.sh STEP`. vLLM 0.26.0 staged
# per ../shared/gpu-vllm/README.md first. Long jobs run detached (`bg`) so a call's time limit cannot
# orphan a vLLM server; `wait` polls them and copies what finished to $OUT.
set -u
step=$1
source /tmp/gpu-vllm/env.sh
export PYTHONPATH=$PWD/src:$PYTHONPATH
export VLLM_ALLREDUCE_USE_SYMM_MEM=0  # symmetric-memory all-reduce can use NVLink multicast: kept off here
M=/tmp/hotweights-models
mkdir -p /tmp/bg
bg() {  # bg NAME COMMAND: detached; /tmp/bg/NAME.log, exit code in /tmp/bg/NAME.rc
  local name=$1; shift
  rm -f /tmp/bg/$name.rc
  setsid nohup bash -c "( $* ) > /tmp/bg/$name.log 2>&1; echo \$? > /tmp/bg/$name.rc" > /dev/null 2>&1 &
  echo "started $name"
}
collect() {
  for f in /tmp/bg/*.log /tmp/bg/*.rc /tmp/bg/*.json /tmp/vr.json; do [ -f "$f" ] && cp "$f" "$OUT/"; done
  for d in verify8b verifytp2; do [ -d /tmp/$d ] && tar czf "$OUT/$d.tgz" -C /tmp $d; done
  [ -d /tmp/vr-logs ] && tar czf "$OUT/vr-logs.tgz" -C /tmp vr-logs
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
}
wait_for() {  # wait_for SECONDS NAME...: until every NAME has finished or SECONDS passed
  local limit=$1; shift
  local t=0
  while [ $t -lt $limit ]; do
    local pending=0
    for n in "$@"; do [ -f /tmp/bg/$n.rc ] || pending=1; done
    [ $pending = 0 ] && break
    sleep 5; t=$((t + 5))
  done
  for n in "$@"; do
    echo "== $n: $([ -f /tmp/bg/$n.rc ] && echo "exit $(cat /tmp/bg/$n.rc)" || echo running)"
    tail -3 /tmp/bg/$n.log | cut -c1-600
  done
  collect
}
case $step in
install)
  bash /tmp/gpu-vllm/stage.sh .gpu-vllm/project && bash /tmp/gpu-vllm/install.sh
  nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv; df -h /tmp | tail -1; nproc; free -g | head -2
  python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count())'
  time python3 -m hotweights demo-model $M/8b --size 8b --gen-device cuda
  ;;
serve8b)  # issue 14: the embedded server's restart, 8B, one GPU, nothing else running
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/serve_restart.py --model $M/8b --size 8b --device cuda --repeat 3 \
    --json > /tmp/bg/serve_restart_8b.json
  tail -c 1500 /tmp/bg/serve_restart_8b.json; echo
  # issue 12: TP=2 acceptance on both GPUs; the 32B checkpoint is drawn meanwhile (a few GiB of GPU memory)
  bg verifytp2 python3 -m hotweights verify --engine vllm --device cuda --model $M/8b --dtype bfloat16 \
    --tensor-parallel-size 2 --port 8402 --out /tmp/verifytp2 --json
  bg gen32b "python3 -m hotweights demo-model $M/32b --size 32b --gen-device cuda && sync"
  collect
  ;;
wait)
  wait_for "$2" "${@:3}"
  ;;
pair1)  # GPU0: vLLM restart rounds (CUDA graphs); GPU1: verify on the 8B, default --gpu-memory-utilization
  bg vr1 CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vllm_restart.py --device cuda --model $M/8b --socket-dir /tmp/hw-vr \
    --keep-daemon --append /tmp/vr.json --logs /tmp/vr-logs --modes disk,engine,engine_copy,stream,disk --repeat 1 --json
  bg verify8b CUDA_VISIBLE_DEVICES=1 python3 -m hotweights verify --engine vllm --device cuda --model $M/8b \
    --dtype bfloat16 --port 8401 --out /tmp/verify8b --json
  wait_for "$2" vr1 verify8b
  ;;
pair2)  # GPU0: where vLLM's weight clock goes, then more rounds; GPU1: the 32B serve restart, cold page cache
  bg vr2 "CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vllm_load_window.py --model $M/8b --socket-dir /tmp/hw-vr \
    --device cuda --profile --json > /tmp/bg/window.json && CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vllm_restart.py \
    --device cuda --model $M/8b --socket-dir /tmp/hw-vr --keep-daemon --append /tmp/vr.json --logs /tmp/vr-logs \
    --modes engine_copy,stream,disk,engine --repeat 1 --json"
  bg serve32b "CUDA_VISIBLE_DEVICES=1 python3 benchmarks/serve_restart.py --model $M/32b --size 32b --device cuda \
    --repeat 1 --cold --json > /tmp/bg/serve_restart_32b_cold.json"
  wait_for "$2" vr2 serve32b
  ;;
pair1b)  # after TP=2: GPU1 verify on the 8B (default --gpu-memory-utilization); GPU0 the 32B serve restart with a
  # cold page cache, then vLLM restart rounds (CUDA graphs)
  bg verify8b CUDA_VISIBLE_DEVICES=1 python3 -m hotweights verify --engine vllm --device cuda --model $M/8b \
    --dtype bfloat16 --port 8401 --out /tmp/verify8b --json
  bg gpu0 "CUDA_VISIBLE_DEVICES=0 python3 benchmarks/serve_restart.py --model $M/32b --size 32b --device cuda \
    --repeat 1 --cold --json > /tmp/bg/serve_restart_32b_cold.json; CUDA_VISIBLE_DEVICES=0 python3 \
    benchmarks/vllm_restart.py --device cuda --model $M/8b --socket-dir /tmp/hw-vr --keep-daemon --append /tmp/vr.json \
    --logs /tmp/vr-logs --modes engine,disk,engine_copy,stream,disk --repeat 1 --json"
  wait_for "$2" verify8b gpu0
  ;;
esac
