#!/usr/bin/env bash
# One H200 session for `hotweights vllm serve` from a warm standby (vLLM 0.26.0 staged and installed per
# ../shared/gpu-vllm/README.md first). Run detached (setsid nohup), poll for /tmp/sb/DONE; writes /tmp/sb/.
#   bash benchmarks/gpu_standby_session.sh [TP]
set -u
tp=${1:-1}
source /tmp/gpu-vllm/env.sh
mkdir -p /tmp/sb
cd "$(dirname "$0")/.."
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -c 'import vllm, torch, hotweights; print("vllm", vllm.__version__, "torch", torch.__version__, "hotweights", hotweights.__version__)'
  test -f /tmp/m8b/config.json || python3 -m hotweights demo-model /tmp/m8b --size 8b --gen-device cuda
  python3 benchmarks/vllm_standby.py --model /tmp/m8b --repeat 3 --tensor-parallel-size "$tp" \
    --gpu-memory-utilization 0.85 --out /tmp/sb/logs$tp --json > /tmp/sb/standby_8b_tp$tp.json
  echo "benchmark rc=$?"
  date -u
} > /tmp/sb/session$tp.log 2>&1
touch /tmp/sb/DONE$tp
