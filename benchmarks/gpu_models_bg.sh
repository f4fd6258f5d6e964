#!/usr/bin/env bash
# GPU, first call of a session (before vLLM is staged): write the demo models in the background, detached, so that
# they are on disk by the time the session script needs them. Needs only the image's torch: hotweights from this
# checkout's src/. Generated on the GPU (GEN_DEVICE=cpu: ~6 s per GB here instead). The session scripts wait for it to
# end before any vLLM start: a CUDA process that frees memory beside one fails vLLM's memory profile (on 2026-12-03
# the default engine's first start: `Error in memory profiling`).
#   bash benchmarks/gpu_models_bg.sh W N [SIZE]   (N models m0..m(N-1) under W; m1.. link m0's shards but their last)
set -u
W=$1; N=$2; SIZE=${3:-8b}
mkdir -p "$W"
cd "$(dirname "$0")"
setsid nohup env PYTHONPATH="$(cd .. && pwd)/src" python3 -c "import sys; from pathlib import Path
from switch_mix import write_models
write_models(Path(sys.argv[1]), [sys.argv[3]] * int(sys.argv[2]), sys.argv[4], link_shards=True)" "$W" "$N" "$SIZE" "${GEN_DEVICE:-cuda}" \
  > "$W/models.log" 2>&1 < /dev/null &
echo "writing $N $SIZE models under $W (pid $!)"
