#!/usr/bin/env bash
# One GPU session for `hotweights vllm serve` from a warm standby (vLLM 0.26.0 staged and installed per
# ../shared/gpu-vllm/README.md first). Run detached (setsid nohup), poll for /tmp/sb/DONE-<tag>; writes /tmp/sb/.
#   [UTIL=0.85] bash benchmarks/gpu_standby_session.sh [TP] [SIZE] [MODES] [REPEAT]
# e.g. `... 1 8b stock,launcher 3` (one H200) or `UTIL=0.75 ... 2 32b stock_cold,launcher,stock,launcher,launcher 1`
# (two: vLLM 0.26 refuses a disk start unless free memory >= UTIL x total, and the cache holds 30.5 GiB per GPU).
set -u
tp=${1:-1} size=${2:-8b} modes=${3:-stock,launcher} repeat=${4:-3} util=${UTIL:-0.85}
tag=${size}_tp$tp
source /tmp/gpu-vllm/env.sh
mkdir -p /tmp/sb
cd "$(dirname "$0")/.."
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -c 'import vllm, torch, hotweights; print("vllm", vllm.__version__, "torch", torch.__version__, "hotweights", hotweights.__version__)'
  test -f /tmp/m$size/config.json || python3 -m hotweights demo-model /tmp/m$size --size "$size" --gen-device cuda
  python3 benchmarks/vllm_standby.py --model /tmp/m$size --repeat "$repeat" --modes "$modes" \
    --tensor-parallel-size "$tp" --gpu-memory-utilization "$util" --out /tmp/sb/logs-$tag --json > /tmp/sb/standby_$tag.json
  echo "benchmark rc=$?"
  date -u
} > /tmp/sb/session-$tag.log 2>&1
tar -C /tmp/sb -czf /tmp/sb/logs-$tag.tgz logs-$tag
touch /tmp/sb/DONE-$tag
