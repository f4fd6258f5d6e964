#!/usr/bin/env bash
# GPU, each call while a detached session script runs: wait up to S seconds (or until it is done), print its
# progress, and bring back what it wrote so far (one archive: a call returns only a few files).
#   bash benchmarks/gpu_poll.sh OUTDIR S [W]   (W: its models' directory, whose fronts' logs come back too)
D=$1; S=$2; W=${3:-}
end=$(( $(date +%s) + S ))
while [ "$(date +%s)" -lt "$end" ] && [ ! -f "$D/done" ]; do sleep 5; done
cat "$D/progress.txt" 2>/dev/null
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null
free -g | sed -n 2p
df -h /tmp | tail -1
if [ -n "$W" ]; then  # each run's fronts apart (fill3off and fill3 both have a trace-front-park.log)
  mkdir -p "$D/fronts" && cp "$W"/drills/front.log "$D/fronts/" 2>/dev/null
  for f in "$W"/trace-*/trace-front-*.log; do
    [ -f "$f" ] && cp "$f" "$D/fronts/$(basename "$(dirname "$f")")_$(basename "$f")"
  done
fi
[ -n "$W" ] && tar czf "$D/engines.tgz" "$W"/trace-*/trace-logs-* 2>/dev/null  # engines' logs so far (a lost machine)
tar czf "$OUT/hwout.tgz" -C "$D" --exclude=all.tgz . 2>/dev/null
ls -la "$OUT"
[ -f "$D/done" ] && echo DONE
